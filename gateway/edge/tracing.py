"""Tracing at the edge (docs/tracing.md): the switch, the middleware that
gives each `/v1/*` request its span, and the decision's attributes.

Off unless an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), and off with `OTEL_SDK_DISABLED=true`.
While off there is no middleware, OpenTelemetry is not imported, and a route
reads one attribute of the no-op span (`NULL_SPAN`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.decide.routing import Routed
from gateway.settings import Settings
from gateway.telemetry.spans import NULL_SPAN, RequestSpan, Tracer

SPAN = "span"  # the request's span, in the ASGI scope's state
OPERATIONS = {"completions": "text_completion"}  # GenAI operation names; every other route is "chat"


def tracer_for(settings: Settings) -> Tracer:
    """The OTLP tracer when OpenTelemetry's variables switch tracing on, else the no-op one."""
    disabled = settings.otel_sdk_disabled.strip().lower() == "true"
    if disabled or not (settings.otel_endpoint or settings.otel_traces_endpoint):
        return Tracer()
    from gateway.telemetry.otlp import OtlpTracer, traces_url  # only now: off costs no import

    return OtlpTracer(traces_url(settings.otel_endpoint, settings.otel_traces_endpoint), settings.otel_service_name)


def span_of(request: Request) -> RequestSpan:
    """The request's span; the no-op one when tracing is off."""
    span: RequestSpan = request.scope.get("state", {}).get(SPAN, NULL_SPAN)
    return span


def trace_decision(request: Request, endpoint: str, body: Mapping[str, Any], routed: Routed) -> RequestSpan:
    """The request's span, named and given what the decision read and chose."""
    span = span_of(request)
    if not span.recording:
        return span
    features, decision = routed.features, routed.decision
    operation = OPERATIONS.get(endpoint, "chat")
    model = features.model or body.get("model")
    span.rename(f"{operation} {model}" if isinstance(model, str) else operation)
    predicted = None if decision.fastest is None else decision.fastest.chosen.predicted
    span.set({
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model if isinstance(model, str) else None,
        "gen_ai.request.temperature": features.temperature,
        "gen_ai.request.max_tokens": features.max_tokens,
        "specgate.api": endpoint,
        "specgate.pool": decision.pool,
        "specgate.rule": decision.rule,
        "specgate.reason": decision.reason,
        "specgate.probe": decision.probe,
        "specgate.domain": features.domain,
        "specgate.predicted.ttft_s": None if predicted is None else predicted.ttft_s,
        "specgate.predicted.tpot_s": None if predicted is None else predicted.tpot_s,
        "specgate.predicted.e2e_s": None if predicted is None else predicted.e2e_s,
    })
    return span


class TracingMiddleware:
    """A span for each `/v1/*` request, from its arrival to its answer's last
    byte, continuing the client's trace context. Added only while tracing is on."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        span = self.tracer.start(scope["method"], scope["path"], _trace_context(scope["headers"]))
        state = scope.setdefault("state", {})
        state[SPAN] = span
        status = 500  # nothing answered: the app raised

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            span.set({"specgate.request_id": state.get("request_id")})
            span.end(status)


def _trace_context(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The W3C trace context headers among the request's (ASGI gives names in lower case)."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in headers
            if name in (b"traceparent", b"tracestate")}
