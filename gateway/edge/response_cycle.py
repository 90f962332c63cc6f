"""One request's ASGI `receive` and `send` on a connection of `specgate serve`.

uvicorn's `RequestResponseCycle` (httptools_impl.py), with the same checks
and the same bytes on the wire, written where mypyc compiles it: uvicorn's
is interpreted, and its `send` alone (a frame per message, two regular
expressions per response header) was the largest interpreted frame of a
served request. Its `asyncio.Event` is a `Wakeup` here, for the same reason.

What the connection's protocol (http_protocol.py) reads and sets of a cycle:
`response_complete`, `disconnected`, `keep_alive`, `message_event`, and the
`request` body that has arrived (uvicorn's `body` and `more_body`), which is
an object of its own so that the scope's `BODY_IN_EXTENSION` can hold it
without holding the cycle (a compiled class takes no weak reference).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Scope
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

# uvicorn's: the bytes a response header's name and value may not hold
HEADER_NAME_REFUSED = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
HEADER_VALUE_REFUSED = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
# The same bytes, for `refuses`: a regex's character class costs some 4k instructions a search of
# a response's names or values, where `translate` deletes them in a C loop
NAME_REFUSED = bytes(b for b in range(256) if HEADER_NAME_REFUSED.match(bytes([b])))
VALUE_REFUSED = bytes(b for b in range(256) if HEADER_VALUE_REFUSED.match(bytes([b])))
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


class Wakeup:
    """`asyncio.Event`'s `set`, `clear`, `is_set` and `wait`, compiled."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []

    def set(self) -> None:
        if not self._set:
            self._set = True
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            self._waiters.remove(waiter)


class RequestBody:
    """What has arrived of a request's body and is not yet received by the app, and whether
    more will come."""

    def __init__(self) -> None:
        self.held = bytearray()
        self.more = True

    def whole(self) -> bool:
        """Whether the whole body has arrived (`body.BODY_IN_EXTENSION`)."""
        return not self.more


class ResponseCycle:
    """The ASGI app's `receive` and `send` for one request, and the task that runs the app."""

    def __init__(self, scope: Scope, transport: asyncio.Transport, flow: FlowControl, logger: logging.Logger,
                 access_logger: logging.Logger | None, default_headers: list[tuple[bytes, bytes]],
                 message_event: Wakeup, expect_100_continue: bool, keep_alive: bool,
                 on_response: Callable[[], None]) -> None:
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.logger = logger
        self.access_logger = access_logger  # None: no access log
        self.default_headers = default_headers
        self.message_event = message_event
        self.on_response = on_response
        # the connection
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        self.request = RequestBody()
        # the response
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0

    async def run_asgi(self, app: ASGIApp) -> None:
        try:
            # an app's result, typed None, is checked: an app that returns one is an error
            result: Any = await app(self.scope, self.receive, self.send)  # type: ignore[func-returns-value]  # see above
        except BaseException as exc:
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self.transport.close()
        else:
            if result is not None:
                self.logger.error("ASGI callable should return None, but returned '%s'.", result)
                self.transport.close()
            elif not self.response_started and not self.disconnected:
                self.logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                self.logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def send_500_response(self) -> None:
        await self.send({"type": "http.response.start", "status": 500,
                         "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"),
                                     (b"connection", b"close")]})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error", "more_body": False})

    async def send(self, message: Message) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            self.response_started = True
            self.waiting_for_100_continue = False
            self.transport.write(self._head(message["status"], message.get("headers", ())))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
            self._write_body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already completed.")

    def _head(self, status: int, headers: Any) -> bytes:
        """The status line and headers, as uvicorn writes them: the server's own headers first."""
        if self.access_logger is not None:
            scope: Any = self.scope  # uvicorn's helpers take its own TypedDict scope
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"],
                                    get_path_with_query_string(scope), scope["http_version"], status)
        pairs = (*self.default_headers, *headers)
        names = b"".join([pair[0] for pair in pairs])
        # every name, and every value, checked at once: a refused byte is refused in whichever it is
        if refuses(NAME_REFUSED, names) or refuses(VALUE_REFUSED, b"".join([pair[1] for pair in pairs])):
            _refuse(pairs)
        lower = not names.islower()  # uvicorn lower-cases each name: here only if one has a capital letter
        content = [STATUS_LINE[status]]
        closes = False
        for pair in pairs:
            name, value = pair[0].lower() if lower else pair[0], pair[1]
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [token.lower().strip() for token in value.split(b",")]:
                self.keep_alive = False
                closes = True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not closes:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked_encoding = True  # neither content-length nor transfer-encoding given
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _write_body(self, body: Any, more_body: Any) -> None:  # any bytes-like body, any truth value
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
        elif self.chunked_encoding:
            if body:
                self.transport.write(b"%x\r\n%b\r\n%b" % (len(body), body, b"" if more_body else LAST_CHUNK))
            elif not more_body:
                self.transport.write(LAST_CHUNK)
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            self.transport.write(body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    async def receive(self) -> Message:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(CONTINUE)
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            if self.flow.read_paused:
                self.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        request = self.request
        message: Message = {"type": "http.request", "body": bytes(request.held), "more_body": request.more}
        request.held = bytearray()
        return message


def _nothing() -> None:
    pass


def refuses(refused: bytes, data: bytes) -> bool:
    """Whether `data` holds one of the bytes in `refused`."""
    return len(data.translate(None, refused)) != len(data)


def _refuse(pairs: Any) -> None:
    """Raises as uvicorn does, at the first refused name or value of `pairs`."""
    for name, value in pairs:
        if HEADER_NAME_REFUSED.search(name) is not None:
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_REFUSED.search(value) is not None:
            raise RuntimeError("Invalid HTTP header value.")
