"""uvicorn's httptools protocol with a deadline and size limits for request headers.

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

Request heads are bounded while they are parsed: past `max_header_bytes`
(request line and headers, as on the wire) or `max_headers` header lines the
request is answered 431 at once, before the head is complete: httptools
would otherwise gather a header value of any size before handing it over.
After such an answer the connection reads and drops what the client still
sends (so the answer is not lost to a reset) until the client closes or the
header deadline closes it.

Every request's scope carries an ASGI extension (`relay.ABORT_EXTENSION`)
that resets the connection at once: a client that stopped reading is cut
with a TCP reset (linger 0), so neither the gateway nor the kernel keeps the
answer queued for a reader that never drains it.

The scope also carries `relay.DISCONNECT_EXTENSION`: the relay hands it a
callback the protocol calls when the connection is lost, instead of running a
task per request that waits on `receive` for `http.disconnect`. And
`body.BODY_IN_EXTENSION`, which tells whether the request's whole body has
arrived: then reading it needs no deadline.

What a connection writes in one turn of the event loop goes out in one write
at the end of that turn (`TurnWrites`): uvicorn writes a response's head, its
body and a stream's closing chunk each on its own, one system call each; a
whole answer is now one, and a stream's last events share theirs with its end.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import weakref
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.edge.body import BODY_IN_EXTENSION
from gateway.errors import GatewayError, HeadersTooLarge, InvalidRequest
from gateway.upstream.relay import ABORT_EXTENSION, DISCONNECT_EXTENSION


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0
    max_header_bytes = 32 * 1024
    max_headers = 100

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._head = _HeadCount()
        self._refused = False  # answered 431: what still comes is dropped
        self._on_lost: Callable[[], None] | None = None  # the relay's watch on the client (DISCONNECT_EXTENSION)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head.reading and self._head.add(data) > self.max_header_bytes:
            self._refuse(HeadersTooLarge(f"request headers are over the {self.max_header_bytes} byte limit"))
            return
        super().data_received(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head.lines += 1
        if self._head.lines > self.max_headers:
            raise _TooMany  # the parser stops and reports it; send_400_response answers 431
        super().on_header(name, value)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head = _HeadCount()  # the next request's head may follow

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows it so
        super().connection_made(transport)
        self.transport = TurnWrites(transport, self.loop)  # uvicorn's flow control keeps the bare one
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost()

    def _watch_lost(self, callback: Callable[[], None] | None) -> None:
        """DISCONNECT_EXTENSION: `callback` is called once if the connection is lost
        before it is replaced or taken back (None). A connection runs one request's
        app at a time (uvicorn queues pipelined ones), so one slot does."""
        self._on_lost = callback

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions: dict[str, Any] = {**self.scope.get("extensions", {}), ABORT_EXTENSION: self._abort,
                                      DISCONNECT_EXTENSION: self._watch_lost}
        self.scope["extensions"] = extensions  # ASGI types extension values as dicts; these are callables
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
        self._head.reading = False
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # this request's cycle (not an upgrade's)
            extensions: dict[str, Any] = self.scope["extensions"]  # set in on_message_begin
            # weakly: the scope holds the check, and the cycle the scope; a strong reference made every
            # request's cycle, scope and transport garbage that only the collector frees (7 us a request)
            held = weakref.ref(cycle)
            extensions[BODY_IN_EXTENSION] = lambda: (found := held()) is not None and not found.more_body

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def send_400_response(self, msg: str) -> None:
        if self._head.lines > self.max_headers:
            self._refuse(HeadersTooLarge(f"the request has over {self.max_headers} header lines"))
            return
        error = InvalidRequest(f"the request is not valid HTTP/1.1: {msg.rstrip('.')}", code="invalid_http")
        self._answer(error, b"400 Bad Request")
        self.transport.close()

    def _refuse(self, error: GatewayError) -> None:
        """Answer 431 now, then drop what the client still sends; the header deadline ends it."""
        self._refused = True
        self._answer(error, b"431 Request Header Fields Too Large")
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.transport.close()

    def _answer(self, error: GatewayError, status: bytes) -> None:
        body = json.dumps(error.body()).encode()
        head = [b"HTTP/1.1 " + status]
        head += [name + b": " + value for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close"]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)

    def _expire(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


class TurnWrites(asyncio.Transport):
    """A connection's transport whose writes wait for the end of the loop's turn
    and leave together, in order, in one write. Closing sends what waits first;
    aborting drops it, as an abort drops what the kernel holds."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if not self._transport.is_closing():  # the client went: nothing to send it to
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(data) for data in self._pending)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class _TooMany(Exception):
    """Raised in the parser's header callback: one header line too many."""


class _HeadCount:
    """The bytes of one request's head seen so far, counted as they arrive
    (up to the blank line that ends it, which may span two reads)."""

    def __init__(self) -> None:
        self.reading = True
        self.size = 0
        self.lines = 0
        self._tail = b""

    def add(self, data: bytes) -> int:
        window = self._tail + data if self._tail else data  # a head in one read (the usual case): no copy
        end = window.find(b"\r\n\r\n")
        if end < 0:
            self.size += len(data)
            self._tail = window[-3:]
        else:
            self.size += max(0, end + 4 - len(self._tail))
            self.reading = False
        return self.size


def with_header_timeout(seconds: float, max_bytes: int = 32 * 1024,
                        max_headers: int = 100) -> type[HeaderDeadlineProtocol]:
    """The protocol class to give uvicorn as `http=`, with this deadline and these limits."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,),
                {"header_timeout_s": seconds, "max_header_bytes": max_bytes, "max_headers": max_headers})
