"""`create_openai_app`: a Starlette app that looks like vLLM's OpenAI server.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `POST
/v1/messages` and `POST /v1/responses` (translated over chat, as vLLM does:
translate.py), `GET /v1/models`,
`GET /health`, `GET /metrics`. The app owns the wire format (JSON and SSE),
the `vllm:*` metrics and the running/waiting accounting; the `TokenGenerator`
it is given owns tokens and timing. Streams are sent unbuffered, and a client
that disconnects cancels its generator, streaming or not.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backends.serving.acceptance import AcceptanceTally
from backends.serving.answers import (
    SSE_DONE,
    ResponseBuilder,
    error_body,
    model_list,
    random_id,
    sse,
    system_fingerprint,
    usage,
)
from backends.serving.disconnect import ClientGone, DisconnectAwareStream, run_until_disconnect
from backends.serving.generation import (
    Delta,
    Endpoint,
    GenerationRequest,
    TokenGenerator,
    estimate_tokens,
)
from backends.serving.metrics import VllmMetrics
from backends.serving.parsing import ProtocolError, parse_request
from backends.serving.translate import ResponsesStore, anthropic_error, message_events, messages_to_chat, whole_message


class RequestRun:
    """One request's life in the metrics: waiting, then running, then finished.

    `started` flips on `mark_running` (the generator admitted the request to
    a batch) or, at the latest, on the first delta."""

    def __init__(self, metrics: VllmMetrics, request: GenerationRequest, spec_tokens: int | None = None) -> None:
        self.metrics = metrics
        self.acceptance = AcceptanceTally(spec_tokens) if spec_tokens else None
        self.request = dataclasses.replace(request, mark_running=self.mark_running)
        self.arrived = time.monotonic()
        self.started = False
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.gaps: list[float] = []
        self.completion_tokens = 0
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        metrics.request_arrived()

    def mark_running(self) -> None:
        if not self.started:
            self.started = True
            self.metrics.request_started()

    def record(self, delta: Delta) -> None:
        self.mark_running()
        now = time.monotonic()
        if delta.tokens:
            if self.first_token_at is None:
                self.first_token_at = now
            elif self.last_token_at is not None:
                self.gaps.append(now - self.last_token_at)
            self.last_token_at = now
        self.completion_tokens += delta.tokens
        if delta.prompt_tokens is not None:
            self.prompt_tokens = delta.prompt_tokens
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        if self.acceptance is not None:
            self.acceptance.observe(delta.drafted, delta.accepted)

    def response_metrics(self) -> dict[str, Any] | None:
        """`metrics` of the answer: the acceptance summary when this server reports it."""
        return None if self.acceptance is None else {"speculative_decoding": self.acceptance.summary()}

    def prompt_token_count(self) -> int:
        if self.prompt_tokens is None:
            self.prompt_tokens = estimate_tokens(self.request.prompt_text())
        return self.prompt_tokens

    def close(self, finish_reason: str) -> None:
        """Leave the running/waiting gauges and record the outcome, once."""
        self.metrics.request_left(self.started)
        ttft = None if self.first_token_at is None else self.first_token_at - self.arrived
        self.metrics.observe_finished(
            prompt_tokens=self.prompt_token_count(),
            generation_tokens=self.completion_tokens,
            finish_reason=finish_reason,
            e2e_seconds=time.monotonic() - self.arrived,
            ttft_seconds=ttft,
            inter_token_seconds=self.gaps,
        )


def create_openai_app(
    generator: TokenGenerator,
    metrics: VllmMetrics,
    model_name: str,
    *,
    max_model_len: int | None = None,
    model_root: str | None = None,
    healthy: Callable[[], bool] = lambda: True,
    fingerprint: str | None = None,
    spec_decode_metrics: int | None = None,
) -> Starlette:
    """Serve `generator` as model `model_name`. `healthy()` decides whether
    `GET /health` answers 200 or 503 (empty body either way, as vLLM).
    `fingerprint` is the `system_fingerprint` (default: vLLM-shaped, derived
    from the model name). `spec_decode_metrics`, the speculative tokens per
    step, makes every answer carry `metrics.speculative_decoding` as vLLM
    run with `--per-request-spec-decode-metrics summary` does."""
    endpoints = _Endpoints(
        generator,
        metrics,
        model_name,
        max_model_len=max_model_len,
        model_root=model_root,
        healthy=healthy,
        fingerprint=fingerprint if fingerprint is not None else system_fingerprint(model_name),
        spec_tokens=spec_decode_metrics,
    )
    return Starlette(
        routes=[
            Route("/v1/chat/completions", endpoints.chat, methods=["POST"]),
            Route("/v1/completions", endpoints.completions, methods=["POST"]),
            Route("/v1/messages", endpoints.messages, methods=["POST"]),
            Route("/v1/responses", endpoints.responses, methods=["POST"]),
            Route("/v1/models", endpoints.models, methods=["GET"]),
            Route("/health", endpoints.health, methods=["GET"]),
            Route("/metrics", endpoints.metrics_endpoint, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
    )


@dataclasses.dataclass
class _Endpoints:
    """The handlers of one served model."""

    generator: TokenGenerator
    metrics: VllmMetrics
    model_name: str
    max_model_len: int | None
    model_root: str | None
    healthy: Callable[[], bool]
    fingerprint: str
    spec_tokens: int | None = None
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    store: ResponsesStore = dataclasses.field(default_factory=ResponsesStore)

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, "completions")

    async def messages(self, request: Request) -> Response:
        try:
            chat = messages_to_chat(await request.json())
        except ValueError:
            return JSONResponse(anthropic_error(ProtocolError("The request body is not valid JSON.")), 400)
        except ProtocolError as exc:
            return JSONResponse(anthropic_error(exc), status_code=exc.status)
        answer = await self._complete(request, "chat", chat)
        if isinstance(answer, DisconnectAwareStream):
            return DisconnectAwareStream(message_events(answer.chunks))
        if answer.status_code != 200:
            return JSONResponse({"type": "error", "error": {"type": "api_error", "message": answer.body.decode()}},
                                status_code=answer.status_code)
        return JSONResponse(whole_message(json.loads(answer.body)))

    async def responses(self, request: Request) -> Response:
        try:
            chat, turns = self.store.to_chat(await request.json())
        except ValueError:
            return _error(ProtocolError("The request body is not valid JSON."))
        except ProtocolError as exc:
            return _error(exc)
        answer = await self._complete(request, "chat", chat)
        if isinstance(answer, DisconnectAwareStream):
            events = self.store.events(answer.chunks, self.model_name, turns)
            return DisconnectAwareStream(events)
        if answer.status_code != 200:
            return answer
        return JSONResponse(self.store.whole(json.loads(answer.body), turns))

    async def _complete(self, request: Request, endpoint: Endpoint, body: object = None) -> Response:
        if body is None:
            try:
                body = await request.json()
            except ValueError:
                return _error(ProtocolError("The request body is not valid JSON."))
        request_id = request.headers.get("x-request-id") or random_id()
        try:
            parsed = parse_request(endpoint, body, served_model=self.model_name, request_id=request_id)
        except ProtocolError as exc:
            return _error(exc)
        builder = ResponseBuilder(endpoint, self.model_name, request_id, system_fingerprint=self.fingerprint)
        if parsed.stream:
            return DisconnectAwareStream(_events(self.generator, self.metrics, parsed, builder, self.spec_tokens))
        try:
            work = _whole(self.generator, self.metrics, parsed, builder, self.spec_tokens)
            return await run_until_disconnect(request.receive, work)
        except ClientGone:
            return _error(ProtocolError("Client disconnected"))

    async def models(self, request: Request) -> Response:
        listing = model_list(
            self.model_name, root=self.model_root, max_model_len=self.max_model_len, created=self.created
        )
        return JSONResponse(listing)

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if self.healthy() else 503)

    async def metrics_endpoint(self, request: Request) -> Response:
        payload, content_type = self.metrics.render(request.headers.get("accept", ""))
        return Response(payload, headers={"Content-Type": content_type})


async def _http_error(request: Request, exc: Exception) -> Response:
    # vLLM (FastAPI) answers unknown routes and methods with {"detail": ...}
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)


def _error(exc: ProtocolError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _whole(
    generator: TokenGenerator,
    metrics: VllmMetrics,
    request: GenerationRequest,
    builder: ResponseBuilder,
    spec_tokens: int | None = None,
) -> Response:
    """Run a non-streaming request to the end and answer the whole object.
    (Its accounting starts here, so work cancelled before it ran leaves no trace.)"""
    run = RequestRun(metrics, request, spec_tokens)
    pieces: list[str] = []
    outcome = "abort"
    try:
        async with aclosing(generator.generate(run.request)) as deltas:
            async for delta in deltas:
                run.record(delta)
                pieces.append(delta.text)
        outcome = run.finish_reason or "stop"
    except Exception as exc:  # noqa: BLE001 - a generator failure becomes a 500 envelope
        outcome = "error"
        return JSONResponse(_failure(exc), status_code=500)
    finally:
        run.close(outcome)
    text = "".join(pieces)
    return JSONResponse(
        builder.response(text, outcome, run.prompt_token_count(), run.completion_tokens,
                         metrics=run.response_metrics())
    )


def _failure(exc: Exception) -> dict:
    """A generator's exception as vLLM reports engine errors."""
    return error_body(str(exc) or type(exc).__name__, "InternalServerError", 500)


async def _events(
    generator: TokenGenerator,
    metrics: VllmMetrics,
    parsed: GenerationRequest,
    builder: ResponseBuilder,
    spec_tokens: int | None = None,
) -> AsyncIterator[bytes]:
    """The SSE events of a streaming request, in vLLM's order: role chunk (chat
    only), content chunks, the chunk with `finish_reason`, the usage chunk when
    asked for (with the answer's `metrics`), `[DONE]`. A generator failure
    becomes an error event."""
    run = RequestRun(metrics, parsed, spec_tokens)
    request = run.request
    outcome = "abort"
    last_chunk = not request.include_usage

    def running_usage(completion_tokens: int) -> dict[str, int] | None:
        if not request.continuous_usage:
            return None
        return usage(run.prompt_token_count(), completion_tokens)

    try:
        first = True
        finished = False
        async with aclosing(generator.generate(request)) as deltas:
            async for delta in deltas:
                run.record(delta)
                if first:
                    first = False
                    opening = builder.first_chunk(running_usage(0))
                    if opening is not None:
                        yield sse(opening)
                if delta.text == "" and delta.finish_reason is None:
                    continue
                finished = delta.finish_reason is not None
                running = running_usage(run.completion_tokens)
                yield sse(builder.chunk(delta.text, delta.finish_reason, running, last=last_chunk))
        outcome = run.finish_reason or "stop"
        if not finished:
            running = running_usage(run.completion_tokens)
            yield sse(builder.chunk("", outcome, running, last=last_chunk))
        if request.include_usage:
            yield sse(builder.usage_chunk(run.prompt_token_count(), run.completion_tokens, run.response_metrics()))
    except Exception as exc:  # noqa: BLE001 - sent to the client as vLLM does
        outcome = "error"
        yield sse(_failure(exc))
    finally:
        run.close(outcome)
    yield SSE_DONE
