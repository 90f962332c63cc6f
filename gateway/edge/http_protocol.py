"""uvicorn's httptools protocol with a deadline and size limits for request headers.

uvicorn arms no timer before a request's headers are complete: a client that
connects and sends nothing, or sends half a request line and stalls, holds
its connection (a file descriptor) forever. Here every request's line and
headers must arrive within `HeadLimits.timeout_s` of the connection opening (for
the first request) or of the request's first byte (for the next ones on a
keep-alive connection); otherwise the connection is closed. Idle time
between requests stays uvicorn's keep-alive timeout.

A request uvicorn cannot parse (a bad method or header name, two
Content-Length headers, Content-Length beside Transfer-Encoding, a URL too
long for the parser) gets the OpenAI error envelope like every other bad
request, instead of uvicorn's plain-text 400.

Request heads are bounded while they are parsed: past `max_bytes`
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

The methods that run on every request (the parser's callbacks, the start of
the app's task, the end of a response) are written out here, with uvicorn's
behaviour, and its `RequestResponseCycle` is `ResponseCycle`
(response_cycle.py), so that mypyc compiles them (specgate/compiled.py):
uvicorn's are interpreted, some forty frames a request. What stays uvicorn's
runs once a connection (`connection_made`, `connection_lost`) or on a path
the gateway's requests do not take (an upgrade, which it refuses as uvicorn
does without a WebSocket protocol). uvicorn's trace-level log lines of each
connection are kept; its access log is written when uvicorn's access logger
has a handler, as uvicorn decides.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import socket
import struct
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.edge.body import BODY_IN_EXTENSION
from gateway.edge.response_cycle import ResponseCycle, Wakeup
from gateway.errors import GatewayError, HeadersTooLarge, InvalidRequest
from gateway.upstream.relay import ABORT_EXTENSION, DISCONNECT_EXTENSION


class HeadLimits:
    """How long a request's line and headers may take, and how large they may be."""

    def __init__(self, timeout_s: float = 10.0, max_bytes: int = 32 * 1024, max_headers: int = 100) -> None:
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_headers = max_headers


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's protocol with the deadline and limits, its per-request methods written out
    here (and its cycle, response_cycle.py) so that mypyc compiles them: what is left of
    uvicorn's runs once a connection, or on a path no request of the gateway's takes (an upgrade)."""

    url: bytes  # set by each request (uvicorn sets it there too); declared for mypyc

    def __init__(self, *args: Any, limits: HeadLimits | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits or HeadLimits()
        self._header_timer: asyncio.TimerHandle | None = None
        self._head = _HeadCount()
        self._refused = False  # answered 431: what still comes is dropped
        self._on_lost: Callable[[], None] | None = None  # the relay's watch on the client (DISCONNECT_EXTENSION)
        self._cycle: ResponseCycle | None = None  # uvicorn's `cycle` and `pipeline` stay None and empty
        self._pipeline: deque[tuple[ResponseCycle, Any]] = deque()
        self._access_logger = self.access_logger if self.access_log else None
        self._scope: dict[str, Any] = {}  # uvicorn's `scope`, as the gateway's code types it
        config: Any = self.config  # Any: uvicorn types its keep-alive int, and is given seconds as a float
        self._keep_alive_s = float(config.timeout_keep_alive)
        self._extensions: dict[str, Any] = {ABORT_EXTENSION: self._abort, DISCONNECT_EXTENSION: self._watch_lost}

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows it so
        super().connection_made(transport)
        self.transport = TurnWrites(transport, self.loop)  # uvicorn's flow control keeps the bare one
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self._cycle
        if cycle is not None:
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.message_event.set()
        super().connection_lost(exc)
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head.reading and self._head.add(data) > self.limits.max_bytes:
            self._refuse(HeadersTooLarge(f"request headers are over the {self.limits.max_bytes} byte limit"))
            return
        self._unset_keepalive()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def _unset_keepalive(self) -> None:
        timer = self.timeout_keep_alive_task
        if timer is not None:
            timer.cancel()
            self.timeout_keep_alive_task = None

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": self.asgi_version, "spec_version": "2.3"}, "http_version": "1.1",
            "server": self.server, "client": self.client, "scheme": self.scheme, "root_path": self.root_path,
            "headers": self.headers, "state": self.app_state.copy(), "extensions": self._extensions.copy(),
        }
        self._scope = self.scope = scope  # type: ignore[assignment]  # ASGI types extension values as dicts
        if self._header_timer is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head.lines += 1
        if self._head.lines > self.limits.max_headers:
            raise _TooMany  # the parser stops and reports it; send_400_response answers 431
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp keeps a value's trailing whitespace
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head.reading = False
        parser, scope = self.parser, self._scope
        http_version = parser.get_http_version()
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        url: Any = httptools.parse_url(self.url)  # Any: its stub types a missing query as bytes, not None
        path = url.path.decode("ascii")
        scope["path"] = self.root_path + (urllib.parse.unquote(path) if "%" in path else path)
        scope["raw_path"] = self.root_path.encode("ascii") + url.path
        scope["query_string"] = url.query or b""
        app = self.app
        if self.limit_concurrency is not None and (len(self.connections) >= self.limit_concurrency
                                                   or len(self.tasks) >= self.limit_concurrency):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        existing = self._cycle
        cycle = self._cycle = ResponseCycle(
            scope, self.transport, self.flow, self.logger, self._access_logger, self.server_state.default_headers,
            Wakeup(self.loop), self.expect_100_continue, http_version != "1.0" and parser.should_keep_alive(),
            self.on_response_complete)
        # the body, not the cycle: the cycle holds the scope, and a cycle of references made every
        # request's cycle, scope and transport garbage that only the collector frees (7 us a request)
        scope["extensions"][BODY_IN_EXTENSION] = cycle.request.whole
        if existing is None or existing.response_complete:
            self._start(cycle, app)
        else:  # pipelined: queued until the one before is answered
            self.flow.pause_reading()
            self._pipeline.appendleft((cycle, app))

    def _start(self, cycle: ResponseCycle, app: Any) -> None:
        if self.config.reset_contextvars:  # uvicorn's opt-in: the task runs in a fresh context
            task = self.loop.create_task(cycle.run_asgi(app), context=contextvars.Context())
        else:
            task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_body(self, body: bytes) -> None:
        cycle = self._cycle
        if cycle is None or cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
            return
        request = cycle.request
        request.held += body
        if len(request.held) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        self._head = _HeadCount()  # the next request's head may follow
        cycle = self._cycle
        if cycle is None or cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
            return
        cycle.request.more = False
        cycle.message_event.set()

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive()
        if self.flow.read_paused:
            self.flow.resume_reading()
        if self._pipeline:
            cycle, app = self._pipeline.pop()
            self._start(cycle, app)
        else:
            self.timeout_keep_alive_task = self.loop.call_later(self._keep_alive_s, self.timeout_keep_alive_handler)

    def shutdown(self) -> None:
        cycle = self._cycle
        if cycle is None or cycle.response_complete:
            self.transport.close()
        else:
            cycle.keep_alive = False

    def _watch_lost(self, callback: Callable[[], None] | None) -> None:
        """DISCONNECT_EXTENSION: `callback` is called once if the connection is lost
        before it is replaced or taken back (None). A connection runs one request's
        app at a time (pipelined ones wait their turn), so one slot does."""
        self._on_lost = callback

    def _abort(self) -> None:
        if self.transport.is_closing():
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # linger 0: close sends a reset and drops what is queued
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.limits.timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def send_400_response(self, msg: str) -> None:
        if self._head.lines > self.limits.max_headers:
            self._refuse(HeadersTooLarge(f"the request has over {self.limits.max_headers} header lines"))
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
                        max_headers: int = 100) -> Callable[..., HeaderDeadlineProtocol]:
    """The protocol to give uvicorn as `http=`, with this deadline and these limits."""
    return functools.partial(HeaderDeadlineProtocol, limits=HeadLimits(seconds, max_bytes, max_headers))
