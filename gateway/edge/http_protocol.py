"""uvicorn's httptools protocol with a deadline for request headers.

uvicorn arms no timer before a request's headers are complete: a client that
connects and sends nothing, or sends half a request line and stalls, holds
its connection (a file descriptor) forever. Here every request's line and
headers must arrive within `header_timeout_s` of the connection opening (for
the first request) or of the request's first byte (for the next ones on a
keep-alive connection); otherwise the connection is closed. Idle time
between requests stays uvicorn's keep-alive timeout.

A request uvicorn cannot parse (a bad method or header name, two
Content-Length headers, Content-Length beside Transfer-Encoding, a URL too
long for the parser) gets the OpenAI error envelope like every other bad
request, instead of uvicorn's plain-text 400.

Every request's scope carries an ASGI extension (`relay.ABORT_EXTENSION`)
that resets the connection at once: a client that stopped reading is cut
with a TCP reset (linger 0), so neither the gateway nor the kernel keeps the
answer queued for a reader that never drains it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import InvalidRequest
from gateway.upstream.relay import ABORT_EXTENSION


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows it so
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions: dict[str, Any] = {**self.scope.get("extensions", {}), ABORT_EXTENSION: self._abort}
        self.scope["extensions"] = extensions  # ASGI types extension values as dicts; this one is a callable
        if self._header_timer is None:
            self._arm()

    def _abort(self) -> None:
        if self.transport.is_closing():
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # linger 0: close sends a reset and drops what is queued
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def send_400_response(self, msg: str) -> None:
        error = InvalidRequest(f"the request is not valid HTTP/1.1: {msg.rstrip('.')}", code="invalid_http")
        body = json.dumps(error.body()).encode()
        head = [b"HTTP/1.1 400 Bad Request"]
        head += [name + b": " + value for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close"]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()

    def _expire(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class to give uvicorn as `http=`, with this deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": seconds})
