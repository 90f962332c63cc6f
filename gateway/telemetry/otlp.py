"""The tracer while tracing is on: OpenTelemetry's SDK with its own
`TracerProvider` (the process-wide one is left alone), spans batched
(`BatchSpanProcessor`) and exported as OTLP over HTTP/protobuf. The
client's W3C `traceparent` and `tracestate` are continued; each span's
context goes on to the backend in the same headers."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.telemetry.answer import AnswerWatch
from gateway.telemetry.spans import TRACE_HEADERS, Attribute, RequestSpan, Tracer

PROPAGATOR = TraceContextTextMapPropagator()


def traces_url(endpoint: str | None, traces_endpoint: str | None) -> str:
    """Where spans go, as OpenTelemetry's variables say: the traces endpoint as
    it is, else the base endpoint with `/v1/traces`."""
    if traces_endpoint:
        return traces_endpoint
    if not endpoint:
        raise ValueError("an OTLP endpoint is needed to export traces")
    return endpoint.rstrip("/") + "/v1/traces"


class OtlpSpan(RequestSpan):
    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.recording = span.is_recording()  # False when not sampled: only its context goes on
        self.answer: AnswerWatch | None = None
        self.failed = False
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        self.context = list(carrier.items())

    def rename(self, name: str) -> None:
        self.span.update_name(name)

    def set(self, attributes: Mapping[str, Attribute | None]) -> None:
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def fail(self, error_type: str, message: str) -> None:
        self.failed = True
        self.span.set_attribute("error.type", error_type)
        self.span.set_status(trace.StatusCode.ERROR, message)

    def propagate(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(k, v) for k, v in headers if k.lower() not in TRACE_HEADERS] + self.context

    def watch(self, stream: httpx.AsyncByteStream) -> httpx.AsyncByteStream:
        self.answer = AnswerWatch(stream)
        return self.answer

    def end(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if self.answer is not None:
            facts = self.answer.facts()
            self.set({"gen_ai.usage.input_tokens": facts.input_tokens,
                      "gen_ai.usage.output_tokens": facts.output_tokens,
                      "gen_ai.response.finish_reasons": facts.finish_reasons or None})
        if status >= 500 and not self.failed:
            self.fail(str(status), f"answered {status}")
        self.span.end()


class OtlpTracer(Tracer):
    enabled = True

    def __init__(self, url: str, service_name: str) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self.tracer = self.provider.get_tracer("specgate")

    def start(self, method: str, path: str, headers: Mapping[str, str]) -> RequestSpan:
        parent = PROPAGATOR.extract(headers) if headers else None
        span = self.tracer.start_span(f"{method} {path}", context=parent, kind=trace.SpanKind.SERVER,
                                      attributes={"http.request.method": method, "url.path": path})
        return OtlpSpan(span)

    def shutdown(self) -> None:
        self.provider.shutdown()
