"""One exchange with a backend, as an ASGI app: open, relay, finish.

`Relay` watches the client for the whole exchange with one task: if the
client goes away while the backend is still thinking (before headers) or
while the answer is relayed, the upstream request is cancelled at once. A
client that stops reading is cut the same way once one write to it has
waited `write_s` (one timer per exchange, not one per write). Server-sent
events are relayed chunk by chunk as they arrive; while the first chunk is
awaited an SSE comment goes out every `keepalive_s` so idle-timeout proxies
keep the connection. The events that came with the body's end (the answer
says so: `Answer.ended`) go out with the response's end, in one message, and
no read waits to learn of the end. A pool whose policy paces its streams has its bursts
split and spaced by a `Pacer` (pacing.py). An answer that breaks after its
first byte ends with an error event, the way the request's API reports
errors mid-stream (usage.py's `UsagePlan.stream_error`). The exchange is
finished at its end (its claim given back, its numbers recorded), whatever
happened.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import httpx
from starlette.types import Message, Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.upstream.events import EventSplitter
from gateway.upstream.exchange import SSE, Exchange, Outcome
from gateway.upstream.failures import upstream_error
from gateway.upstream.headers import response_headers
from gateway.upstream.pacing import Pacer
from gateway.upstream.proxy import Opened
from gateway.upstream.upstream import Upstream
from gateway.upstream.usage import UsagePlan

# An ASGI extension the server may put in the scope: a callable that resets the
# client connection at once (a graceful close waits for buffers a stalled client never drains).
ABORT_EXTENSION = "specgate.abort"
# Another: a callable that takes a callback (None: no longer) and calls it if the client connection
# is lost, so the relay learns of a client gone without a task of its own waiting on `receive`.
DISCONNECT_EXTENSION = "specgate.on_disconnect"
CLIENT_CLOSED = 499  # nginx's code for "the client went away first"
KEEPALIVE_COMMENT = b": keepalive\n\n"


class RelayTimeouts:
    """A relay's bounds (a plain class: one per request, its `__init__` compiled)."""

    def __init__(self, first_chunk_s: float, keepalive_s: float, write_s: float) -> None:
        self.first_chunk_s = first_chunk_s  # streams: first body chunk after the headers
        self.keepalive_s = keepalive_s
        self.write_s = write_s  # one write to the client; longer and the client is cut

    @classmethod
    def for_chain(cls, chain: Sequence[Upstream], keepalive_s: float, write_s: float) -> RelayTimeouts:
        """A client that stops reading is cut within the shortest total_s of the chain at most."""
        for upstream in chain:  # a loop: `min` over a generator builds both, per request
            total_s = upstream.pool.timeouts.total_s
            if total_s < write_s:
                write_s = total_s
        return cls(chain[0].pool.timeouts.first_byte_s, keepalive_s, write_s)


class _Cut:
    """Cancels `task` (the relay's), and knows whether it did."""

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.fired = False
        self._task = task

    def _fire(self) -> None:
        if self._task is not None:
            self.fired = True
            self._task.cancel()

    def absorb(self) -> bool:
        """In an `except CancelledError`: True if the cancellation was this one's."""
        if self.fired and self._task is not None:
            self._task.uncancel()
            return True
        return False


class ClientWatch(_Cut):
    """Cancels the current task when the client disconnects: told by the server
    (DISCONNECT_EXTENSION) where it can, else by a watcher task on `receive`."""

    def __init__(self, receive: Receive, scope: Scope, task: asyncio.Task[Any] | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(task)
        self._closed = False
        self._watcher: asyncio.Future[None] | None = None
        self._told = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
        if self._told is not None:
            self._told(self._gone)
        else:
            self._watcher = loop.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone()

    def _gone(self) -> None:
        if not self._closed:
            self._fire()

    def close(self) -> None:
        self._closed = True
        if self._told is not None:
            self._told(None)
        if self._watcher is not None:
            self._watcher.cancel()


class WriteWatch(_Cut):
    """Cancels the current task when one write to the client has waited
    `timeout_s`: the client stopped reading, and must not hold the backend.
    A write only notes when it began; one timer checks now and then."""

    def __init__(self, timeout_s: float, task: asyncio.Task[Any] | None, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(task)
        self.timeout_s = timeout_s
        self._since: float | None = None  # when the write under way began
        self._loop = loop
        self._timer = self._loop.call_later(timeout_s, self._check)

    def bound(self, send: Send) -> Send:
        async def bounded_send(message: Message) -> None:
            self._since = self._loop.time()
            try:
                await send(message)
            finally:
                self._since = None
        return bounded_send

    def _check(self) -> None:
        since, now = self._since, self._loop.time()
        if since is not None and now - since >= self.timeout_s:
            self._fire()
            return
        due = self.timeout_s if since is None else since + self.timeout_s - now
        self._timer = self._loop.call_later(due, self._check)

    def close(self) -> None:
        self._timer.cancel()


class _Late(_Cut):
    """Cancels the current task once `timeout_s` has passed, unless closed first: the
    bound `asyncio.timeout` would set, with one timer and without its context manager
    (which cost a stream ten times what the timer does)."""

    def __init__(self, timeout_s: float, task: asyncio.Task[Any] | None, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(task)
        self._timer = loop.call_later(timeout_s, self._fire)

    def close(self) -> None:
        self._timer.cancel()


class Relay:
    """The ASGI app that answers the client with `exchange`'s upstream answer."""

    def __init__(self, exchange: Exchange, timeouts: RelayTimeouts) -> None:
        self.exchange = exchange
        self.timeouts = timeouts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The loop and task, asked once: Python 3.11 asks the kernel for its pid on each
        # `get_running_loop` (and `current_task` without a loop)
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        watch = ClientWatch(receive, scope, task, loop)
        writes = WriteWatch(self.timeouts.write_s, task, loop)
        outcome = Outcome(CLIENT_CLOSED)
        try:  # whatever raises through here unjudged says nothing of the endpoint
            await self._exchange(writes.bound(send), outcome, task, loop)
            outcome.judged = True
        except asyncio.CancelledError:
            stalled = writes.absorb()
            if not (watch.absorb() or stalled):
                raise
            if stalled:
                _abort_client(scope)
            # a client that closes once it has read [DONE] had the whole answer
            outcome.ok, outcome.stalled, outcome.judged = outcome.delivered, stalled, True
            outcome.left = not outcome.delivered
            if not outcome.delivered:
                outcome.status = CLIENT_CLOSED
        finally:
            watch.close()
            writes.close()
            await self.exchange.finish(outcome)

    async def _exchange(self, send: Send, outcome: Outcome, task: asyncio.Task[Any] | None,
                        loop: asyncio.AbstractEventLoop) -> None:
        try:
            opened = await self.exchange.open()
        except GatewayError as exc:
            outcome.status, outcome.error = exc.status_code, exc
            await _send_envelope(send, exc, self.exchange.headers(), self.exchange.request.usage)
            return
        outcome.status, outcome.opened = opened.response.status_code, opened
        if opened.response.headers.get("content-type", "").startswith(SSE):
            await self._relay_stream(send, opened, outcome, task, loop)
        else:
            await self._relay_body(send, opened, outcome)

    async def _relay_body(self, send: Send, opened: Opened, outcome: Outcome) -> None:
        response = opened.response
        try:  # each read is bounded by the transport's read timeout
            content = await response.aread()
        except httpx.HTTPError as exc:
            error = upstream_error(exc)
            outcome.status, outcome.error = error.status_code, error
            await _send_envelope(send, error, self.exchange.headers(), self.exchange.request.usage)
            return
        self.exchange.read_body(content)
        headers = response_headers(response.headers, self.exchange.headers())
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content, "more_body": False})
        outcome.ok = True

    async def _relay_stream(self, send: Send, opened: Opened, outcome: Outcome, task: asyncio.Task[Any] | None,
                            loop: asyncio.AbstractEventLoop) -> None:
        response = opened.response
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": response_headers(response.headers, self.exchange.headers())})
        chunks = response.aiter_raw()
        events = EventSplitter(self.exchange.tap)
        pacer = self._pacer()
        first: bytes | None = None
        last = b""  # the events that came with the body's end: written with the last chunk, in one write
        try:  # the transport holds every read to the request's deadline
            first = await self._first_chunk(chunks, send, task, loop)
            if first and pacer is not None:
                async with aclosing(pacer.pace(_Runs(first, chunks, events))) as runs:
                    async for run in runs:
                        await self._send_events(send, run, outcome)
            elif first:
                last = events.feed(first)
                if not response.ended():  # else no read is left: not one to learn the end from either
                    await self._send_events(send, last, outcome)
                    last = b""
                    async for chunk in chunks:
                        run = events.feed(chunk)
                        if response.ended():
                            last = run
                            break
                        await self._send_events(send, run, outcome)
        except (httpx.HTTPError, TimeoutError) as exc:
            if outcome.delivered:  # [DONE] went out: the answer is whole, only the backend's close was late
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                outcome.ok = True
                return
            # Only whole events went out, so the error event is one the client can parse.
            error = upstream_error(exc)
            outcome.status, outcome.error = error.status_code, error
            outcome.fault = _fault(exc, first is None)
            payload = events.held() + self.exchange.request.usage.stream_error(error)
            await send({"type": "http.response.body", "body": payload, "more_body": False})
            return
        await send({"type": "http.response.body", "body": last + events.rest(), "more_body": False})
        outcome.ok = True

    def _pacer(self) -> Pacer | None:
        """A pacer when the policy paces the pool that answered (docs/routing.md, "Even streams")."""
        pool, request = self.exchange.claim.pool, self.exchange.request
        if pool is None or not request.usage.openai:  # only OpenAI's chunks are paced
            return None
        delay = pool.pacing_delay_s if pool.paces(request.body, request.stream) else None
        return None if delay is None else Pacer(delay, keep_counts=request.usage.keep_counts)

    async def _send_events(self, send: Send, body: bytes, outcome: Outcome) -> None:
        if body:
            await send({"type": "http.response.body", "body": body, "more_body": True})
            outcome.delivered = self.exchange.request.usage.ended(body)

    async def _first_chunk(self, chunks: AsyncIterator[bytes], send: Send, task: asyncio.Task[Any] | None,
                           loop: asyncio.AbstractEventLoop) -> bytes:
        """Await the first chunk in `task` (this one) while a timer sends keepalive comments;
        none within `first_chunk_s` is a TimeoutError."""
        keepalive = _Keepalive(send, self.timeouts.keepalive_s, loop)
        late = _Late(self.timeouts.first_chunk_s, task, loop)
        try:
            return await anext(chunks, b"")
        except asyncio.CancelledError:
            if late.absorb():
                raise TimeoutError(f"no first chunk within {self.timeouts.first_chunk_s:g} s") from None
            keepalive.drop()  # the relay ends here (the client left or stopped reading)
            raise
        finally:
            late.close()
            await keepalive.stop()


class _Keepalive:
    """Sends an SSE comment every `interval` seconds until stopped. A timer
    rather than a task: most first tokens come before the first tick, and
    then this costs one scheduled callback."""

    def __init__(self, send: Send, interval: float, loop: asyncio.AbstractEventLoop) -> None:
        self.send = send
        self.interval = interval
        self.loop = loop
        self.sending: asyncio.Future[None] | None = None
        self.timer = self.loop.call_later(interval, self._tick)

    def _tick(self) -> None:
        if self.sending is None or self.sending.done():
            message = {"type": "http.response.body", "body": KEEPALIVE_COMMENT, "more_body": True}
            self.sending = asyncio.ensure_future(self.send(message), loop=self.loop)
        self.timer = self.loop.call_later(self.interval, self._tick)

    async def stop(self) -> None:
        self.timer.cancel()
        if self.sending is not None and not self.sending.done():
            try:
                await asyncio.shield(self.sending)  # the relay's next send must not overlap it
            except asyncio.CancelledError:
                self.drop()
                raise

    def drop(self) -> None:
        """Stop at once, and drop a comment not written yet: the relay is ending."""
        self.timer.cancel()
        if self.sending is not None:
            self.sending.cancel()
            self.sending = None


class _Runs:
    """The stream as runs of whole events, for a pacer: an iterator of its own rather than an
    async generator, which mypyc cannot compile."""

    def __init__(self, first: bytes, chunks: AsyncIterator[bytes], events: EventSplitter) -> None:
        self._first: bytes | None = first
        self._chunks = chunks
        self._events = events

    def __aiter__(self) -> _Runs:
        return self

    async def __anext__(self) -> bytes:
        first, self._first = self._first, None
        return self._events.feed(first if first is not None else await anext(self._chunks))


def _fault(exc: BaseException, before_first: bool) -> str:
    """How a stream broke, for the ejection log: no first chunk within
    first_byte_s, silence past idle_s, or a broken connection."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return "first_byte" if before_first else "idle"
    return "stream_broken"


def _abort_client(scope: Scope) -> None:
    abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
    if abort is not None:
        abort()


async def _send_envelope(send: Send, error: GatewayError, headers: dict[str, str], plan: UsagePlan) -> None:
    status, body = error.answer(plan.endpoint)
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in {**headers, **error.headers}.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
