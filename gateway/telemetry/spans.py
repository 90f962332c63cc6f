"""What the request path calls to trace a request: a `Tracer` starts one
`RequestSpan` per request. These base classes do nothing: tracing is off, and
a request pays one attribute read (`recording`) where it would add to a span.
The OTLP tracer (`otlp.py`) is built only when tracing is on, so with tracing
off OpenTelemetry is never imported."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx

Attribute = str | bool | int | float | Sequence[str]
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})  # W3C trace context


class RequestSpan:
    """One request's span. `recording`: whether anything is kept, so callers
    build attributes only for a span that keeps them."""

    recording = False

    def rename(self, name: str) -> None:
        """The span's name once the request is known (`chat {model}`)."""

    def set(self, attributes: Mapping[str, Attribute | None]) -> None:
        """Attributes; a None value is left out."""

    def fail(self, error_type: str, message: str) -> None:
        """The request failed: the span's status says so, `error.type` says how."""

    def propagate(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """`headers` for a backend, carrying this span's context instead of the client's."""
        return headers

    def watch(self, stream: httpx.AsyncByteStream) -> httpx.AsyncByteStream:
        """The answer's byte stream, read on its way for usage and finish reasons."""
        return stream

    def end(self, status: int) -> None:
        """The answer went out with HTTP `status`: the span ends."""


NULL_SPAN = RequestSpan()


class Tracer:
    """Starts a request's span, continuing the client's trace context."""

    enabled = False

    def start(self, method: str, path: str, headers: Mapping[str, str]) -> RequestSpan:
        """`headers`: the client's trace context headers (lower-case names), if any."""
        return NULL_SPAN

    def shutdown(self) -> None:
        """Export what is left and stop; blocks while it flushes."""
