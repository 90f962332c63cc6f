"""A lean HTTP/1.1 transport, built for a proxy's hot path.

httpx's default pool checks every pooled connection's socket on every
request and takes several locks per request; at a few dozen concurrent
streams that dominates a gateway's CPU time. This transport swaps the engine
underneath: one asyncio protocol per connection, the C parser uvicorn uses
(httptools), and a LIFO list of idle keep-alive connections per origin. A
connection the server closed while idle is noticed by the event loop
(`connection_lost`), never by polling.

Two ways in. The proxy calls `send` with the request's parts and gets an
`Answer` (answer.py): no httpx model is built on either side. httpx's own
clients (health checks, /v1/models) call `handle_async_request`, with httpx's
requests, responses and timeouts, which goes through `send`. The bytes `send`
writes are those httpx's own transport writes; the errors are httpx's.

Besides httpx's timeouts it honours `extensions["deadline"]` (event-loop time):
no read waits past it, so a backend that trickles bytes cannot stretch a
request beyond its total time; a read cut by it raises `DeadlineReached`, so
the caller can tell the request's own deadline from a silent backend. The
timeout's `idle` entry, when given, bounds every read of a body after its
first chunk (the silence between a stream's tokens); `read` bounds the wait
for the headers and for the first chunk.

Responses: interim 1xx answers (100 Continue, 103 Early Hints) are read and
dropped, only the final response is returned; 101 is refused (the proxy never
asks to switch protocols). The answer to HEAD ends with its headers, whatever
Content-Length says. A connection goes back to the pool only when its last
response was read to the end and nothing arrived after it: bytes nobody asked
for (a late answer, a body after HEAD) close the connection, so they can
never be taken for the next request's answer.

Limits: `keepalive_expiry` drops idle connections older than that;
`max_connections` bounds the requests in flight per origin (a request
waits up to the pool timeout for a slot); `max_keepalive_connections` bounds
the idle connections kept per origin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import httptools
import httpx

from gateway.upstream.answer import Answer
from gateway.upstream.read_timer import DeadlineReached, Expiry, ReadTimer
from gateway.upstream.slots import Slots
from gateway.upstream.target import Origin, Target

HIGH_WATER = 256 * 1024  # pause reading past this much unconsumed body
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # sent with a Content-Length even when empty, as httpx does


class _ClosedEarly(Exception):
    """The server closed the connection before a response byte arrived."""


class Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()  # made by the loop's create_connection; read once, not per wait
        self.timer = ReadTimer(self.loop)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.error: Exception | None = None
        self.idle_since = 0.0
        self.asked = False  # a request went out on this connection
        self._waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self, head: bool = False) -> None:
        self.head = head  # the request was HEAD: the response has no body
        self.headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.interim = False  # parsing a 1xx response that precedes the final one
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.stray = False  # bytes came that belong to no request: never reuse
        self.received_any = False
        self.chunks: list[bytes] = []
        self.buffered = 0

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection always gets a Transport

    def data_received(self, data: bytes) -> None:
        if not self.asked or self.complete:  # nobody is waiting for these bytes
            self.stray = True
            self._abort()
            return
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.error is None:
                self.error = httpx.RemoteProtocolError(f"invalid HTTP response: {exc}")
            self._abort()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.timer.close()
        if not self.complete and self.error is None:
            self.error = _ClosedEarly() if not self.received_any else httpx.RemoteProtocolError(
                "the server closed the connection mid-response")
        self._wake()

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        if self.complete:  # a second answer to one request
            self.stray = True
        else:  # the final response after interim ones: their headers are not its headers
            self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        status = self.parser.get_status_code()
        if status == 101:
            self.error = httpx.RemoteProtocolError("the server switched protocols, which was not asked for")
            self._abort()
        elif status < 200:
            self.interim = True  # its on_message_complete follows at once: 1xx have no body
        else:
            self.status = status
            self.headers_done = True
            if self.head:
                self._finish()

    def on_body(self, body: bytes) -> None:
        if self.complete:  # a body after HEAD's headers
            self.stray = True
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
        elif not self.complete:
            self._finish()

    def _finish(self) -> None:
        # Ask now: once on_message_complete returns the parser resets for the next message.
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True

    # -- used by the transport
    def send(self, data: bytes, head: bool = False) -> None:
        self._reset(head)
        self.parser = httptools.HttpResponseParser(self)
        self.asked = True
        assert self.transport is not None
        # A server may drop a new connection before the request goes out; uvloop
        # raises on writes to a closed transport. `wait_headers` reports it instead.
        if not self.closed and not self.transport.is_closing():
            self.transport.write(data)

    def reusable(self) -> bool:
        return (self.complete and self.keep_alive and not self.stray and not self.closed
                and self.error is None)

    async def wait_headers(self, read_timeout: float | None, deadline: float | None) -> None:
        while not self.headers_done:
            self._raise_if_broken()
            await self._wait(*_bounded(self.loop, read_timeout, deadline))

    async def next_chunk(self, timeout: float | None, expiry: Expiry = httpx.ReadTimeout) -> bytes | None:
        while True:
            if self.chunks:
                chunk = b"".join(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
                self.chunks.clear()
                if self.buffered > HIGH_WATER and self.transport is not None:
                    self.transport.resume_reading()
                self.buffered = 0
                return chunk
            if self.complete:
                return None
            self._raise_if_broken()
            await self._wait(timeout, expiry)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True
        self.timer.close()

    def _raise_if_broken(self) -> None:
        if self.error is not None:
            raise self.error
        if self.closed:
            raise httpx.RemoteProtocolError("the connection is closed")

    async def _wait(self, timeout: float | None, expiry: Expiry = httpx.ReadTimeout) -> None:
        waiter = self._waiter = self.loop.create_future()
        if timeout is not None:
            self.timer.watch(waiter, timeout, expiry)
        try:
            await waiter
        finally:
            self._waiter = None
            self.timer.unwatch()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def _bounded(loop: asyncio.AbstractEventLoop, read_timeout: float | None,
             deadline: float | None) -> tuple[float | None, Expiry]:
    """The wait allowed for one read and what its end raises: the read timeout, cut
    short by the request's deadline (`extensions["deadline"]`, `loop`'s time) if any."""
    if deadline is None:
        return read_timeout, httpx.ReadTimeout
    left = deadline - loop.time()
    if left <= 0:
        raise DeadlineReached("the request's total time is up")
    if read_timeout is None or left <= read_timeout:
        return left, DeadlineReached
    return read_timeout, httpx.ReadTimeout


class ResponseStream(httpx.AsyncByteStream):
    def __init__(self, transport: PooledTransport, origin: Origin, connection: Connection,
                 read_timeout: float | None, deadline: float | None, idle_timeout: float | None = None) -> None:
        self._transport = transport
        self._origin = origin
        self._connection = connection
        self._read_timeout = read_timeout
        self._idle_timeout = read_timeout if idle_timeout is None else idle_timeout
        self._deadline = deadline
        self._done = False
        self._timeout = read_timeout  # the next read's: the first chunk's, then the silence between chunks

    def __aiter__(self) -> ResponseStream:  # an iterator of its own: mypyc cannot compile an async generator
        return self

    async def __anext__(self) -> bytes:
        if self._done:  # once closed, the connection may carry another request's answer: never read it again
            raise httpx.StreamClosed()
        chunk = await self._connection.next_chunk(*_bounded(self._connection.loop, self._timeout, self._deadline))
        if chunk is None:
            raise StopAsyncIteration
        self._timeout = self._idle_timeout
        return chunk

    def ended(self) -> bool:
        """Whether the body has been read to its end: the next read would end the stream."""
        return not self._done and self._connection.complete and not self._connection.chunks

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._transport.release(self._origin, self._connection)


class PooledTransport(httpx.AsyncBaseTransport):
    def __init__(self, limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits()
        self._expiry = limits.keepalive_expiry
        self._max_connections = limits.max_connections or 1_000_000
        self._max_idle = limits.max_keepalive_connections if limits.max_keepalive_connections is not None \
            else self._max_connections
        self._idle: dict[Origin, list[Connection]] = {}
        self._slots: dict[Origin, Slots] = {}
        self._open: set[Connection] = set()

    async def send(self, method: str, target: Target, headers: Sequence[tuple[str, str]], body: bytes,
                   timeouts: Mapping[str, float | None], deadline: float | None) -> Answer:
        """The proxy's way in: the request written straight from its parts, the response read
        as an `Answer`, no httpx model on either side. A header that is not ASCII raises
        `UnicodeEncodeError` before anything is taken or sent."""
        payload = _message(method, target, headers, body)
        origin, connection = await self._start(target.origin, method, payload, timeouts, deadline)
        stream = ResponseStream(self, origin, connection, timeouts.get("read"), deadline, timeouts.get("idle"))
        return Answer(connection.status, connection.headers, stream, stream.ended)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """httpx's way in (the pool's `httpx.AsyncClient`: health checks, /v1/models), through `send`;
        httpx's client attaches the request to any error."""
        headers = [(name.decode("ascii"), value.decode("ascii")) for name, value in request.headers.raw
                   if name.lower() not in (b"host", b"content-length")]
        answer = await self.send(request.method, Target(request.url), headers, await request.aread(),
                                 request.extensions.get("timeout", {}), request.extensions.get("deadline"))
        return httpx.Response(answer.status_code, headers=answer.headers.raw, stream=answer.stream,
                              extensions={"http_version": b"HTTP/1.1"})

    async def _start(self, origin: Origin, method: str, payload: bytes, timeouts: Mapping[str, Any],
                     deadline: float | None) -> tuple[Origin, Connection]:
        """A free slot of the origin's, then the request sent and its headers read."""
        slots = self._slots.get(origin)
        if slots is None:
            slots = self._slots[origin] = Slots(self._max_connections)
        if not slots.take():  # only a full pool waits, bounded by the pool timeout
            try:
                await slots.wait(asyncio.get_running_loop(), timeouts.get("pool"))
            except TimeoutError:
                raise httpx.PoolTimeout("no free connection slot within the pool timeout") from None
        try:
            return origin, await self._exchange(origin, method, payload, timeouts, deadline)
        except BaseException:
            slots.release()
            raise

    async def _exchange(self, origin: Origin, method: str, payload: bytes, timeouts: Mapping[str, Any],
                        deadline: float | None) -> Connection:
        head = method == "HEAD"
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.closed or (self._expiry is not None and
                                     connection.loop.time() - connection.idle_since > self._expiry):
                self._discard(connection)
                continue
            connection.send(payload, head)
            try:
                await connection.wait_headers(timeouts.get("read"), deadline)
                return connection
            except _ClosedEarly:  # the server dropped the idle connection: use a new one
                self._discard(connection)
            except BaseException:
                self._discard(connection)
                raise
        connection = await self._connect(origin, timeouts.get("connect"))
        connection.send(payload, head)
        try:
            await connection.wait_headers(timeouts.get("read"), deadline)
        except _ClosedEarly:
            self._discard(connection)
            raise httpx.RemoteProtocolError("the server closed the connection without a response") from None
        except BaseException:
            self._discard(connection)
            raise
        return connection

    async def _connect(self, origin: Origin, timeout: float | None) -> Connection:
        scheme, host, port = origin
        ssl = scheme == b"https" or None
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(Connection, host.decode("ascii"), port, ssl=ssl), timeout)
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host.decode()}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host.decode()}:{port}: {exc}") from None
        self._open.add(connection)
        return connection

    def release(self, origin: Origin, connection: Connection) -> None:
        self._slots[origin].release()
        idle = self._idle.setdefault(origin, [])
        if connection.reusable() and len(idle) < self._max_idle:
            connection.idle_since = connection.loop.time()
            idle.append(connection)
        else:
            self._discard(connection)

    def _discard(self, connection: Connection) -> None:
        connection.close()
        self._open.discard(connection)

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()


def _message(method: str, target: Target, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    """The request as it goes on the wire, with the `Host` and `Content-Length` httpx would
    add (a body, or a method that carries one, gets its length)."""
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    if body or method in BODY_METHODS:
        lines += f"Content-Length: {len(body)}\r\n"
    return (method.encode("ascii") + b" " + target.path + b" HTTP/1.1\r\nHost: " + target.host
            + b"\r\n" + lines.encode("ascii") + b"\r\n" + body)
