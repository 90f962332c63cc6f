"""ASGI middleware in front of the fake vLLM app: records every request and
injects the faults a test asked for (error statuses, a late first byte, a
connection cut in the middle of a stream)."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.serving.answers import dumps, error_body


@dataclass(frozen=True)
class RecordedRequest:
    """A request as the fake received it. Header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, the raw bytes when not JSON, None when empty
    received_at: float  # time.monotonic()


@dataclass
class Faults:
    """What the next requests to `/v1/*` suffer. Counters count down per request."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    fail_count: int = 0
    fail_status: int = 500
    fail_message: str = "injected failure"
    first_byte_count: int = 0
    first_byte_delay: float = 0.0
    cut_count: int = 0
    cut_after_events: int = 1
    # Random faults, drawn from the seeded `rng` for requests no counted fault claimed.
    fail_rate: float = 0.0
    slow_rate: float = 0.0
    slow_seconds: float = 0.0
    cut_rate: float = 0.0
    rng: random.Random = field(default_factory=random.Random)
    injected: dict[str, int] = field(default_factory=dict)  # random faults dealt, by kind

    def take(self) -> tuple[int | None, float, int | None]:
        """Claim this request's faults: (error status, first-byte delay, cut after N events)."""
        with self.lock:
            status = delay = cut = None
            if self.fail_count:
                self.fail_count -= 1
                status = self.fail_status
            if self.first_byte_count:
                self.first_byte_count -= 1
                delay = self.first_byte_delay
            if self.cut_count:
                self.cut_count -= 1
                cut = self.cut_after_events
            if status is None and self._draw(self.fail_rate, "fail"):
                status = self.fail_status
            if delay is None and self._draw(self.slow_rate, "slow"):
                delay = self.slow_seconds
            if cut is None and status is None and self._draw(self.cut_rate, "cut"):
                cut = self.cut_after_events
            return status, delay or 0.0, cut

    def _draw(self, rate: float, kind: str) -> bool:
        if rate <= 0.0 or self.rng.random() >= rate:
            return False
        self.injected[kind] = self.injected.get(kind, 0) + 1
        return True


class StreamCut(Exception):
    """Raised after the response started: uvicorn then drops the connection
    without finishing the chunked body, as a crashing backend would."""


def error_type(status: int) -> str:
    """vLLM-style error type for a status: 500 -> "InternalServerError"."""
    return HTTPStatus(status).phrase.replace(" ", "").replace("-", "") + (
        "" if status == 500 else "Error"
    )


class FaultInjector:
    def __init__(self, app: ASGIApp, faults: Faults) -> None:
        self.app = app
        self.faults = faults
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body, receive = await _buffer_body(receive)
        self._record(scope, body)
        if not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        status, delay, cut_after = self.faults.take()
        if delay:
            await asyncio.sleep(delay)
        if status is not None:
            await _send_error(send, status, self.faults.fail_message)
            return
        if cut_after is not None:
            send = _cutting_send(send, cut_after)
        await self.app(scope, receive, send)

    def _record(self, scope: Scope, body: bytes) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        parsed: Any = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = body
        with self._lock:
            self.requests.append(
                RecordedRequest(scope["method"], scope["path"], headers, parsed, time.monotonic())
            )


async def _buffer_body(receive: Receive) -> tuple[bytes, Receive]:
    """Read the whole body now; the app then receives it again, followed by
    whatever the server sends later (http.disconnect)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            replay: list[Message] = [message]
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            replay = []
            break
    body = b"".join(chunks)
    pending = [{"type": "http.request", "body": body, "more_body": False}, *replay]

    async def replaying_receive() -> Message:
        return pending.pop(0) if pending else await receive()

    return body, replaying_receive


async def _send_error(send: Send, status: int, message: str) -> None:
    payload = dumps(error_body(message, error_type(status), status))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def _cutting_send(send: Send, events: int) -> Send:
    sent = 0

    async def cutting_send(message: Message) -> None:
        nonlocal sent
        if message["type"] == "http.response.body" and message.get("body"):
            if sent >= events:
                raise StreamCut(f"connection cut after {events} events")
            sent += 1
        await send(message)

    return cutting_send
