"""Forwarding to a pool: retries before the first byte, then an unbuffered relay.

`Forwarder.open` sends the request to an endpoint of the pool and returns
once response headers arrive. Connect errors and 429/502/503/504 answers are
retried on another endpoint while attempts and the pool's retry budget last;
nothing is retried once a byte has gone to the client. `relay_stream` and
`relay_body` turn the upstream response into an ASGI response that stops the
upstream request as soon as the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

import httpx
from starlette.types import Receive, Scope, Send

from gateway.errors import GatewayError, UpstreamTimeout, UpstreamUnreachable
from gateway.pools import Lease, Pool

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})
# Also dropped from responses: the gateway's own server sets these.
RESPONSE_DROP = HOP_BY_HOP | {"date", "server"}
RETRY_STATUSES = frozenset({429, 502, 503, 504})
KEEPALIVE_COMMENT = b": keepalive\n\n"


def request_headers(headers: Iterable[tuple[str, str]], extra: dict[str, str]) -> list[tuple[str, str]]:
    kept = [(k, v) for k, v in headers
            if k.lower() not in HOP_BY_HOP and k.lower() not in extra and not k.lower().startswith("x-specgate-")]
    return kept + list(extra.items())


def response_headers(headers: httpx.Headers, extra: dict[str, str]) -> list[tuple[bytes, bytes]]:
    kept = [(k.lower(), v) for k, v in headers.raw if k.lower().decode("latin-1") not in RESPONSE_DROP]
    return kept + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]


class RetryBudget:
    """Retries may add at most `ratio` of the requests sent, plus a small reserve."""

    def __init__(self, ratio: float, reserve: float = 10.0) -> None:
        self.ratio = ratio
        self.reserve = reserve
        self.balance = reserve

    def deposit(self) -> None:
        self.balance = min(self.reserve + 100 * self.ratio, self.balance + self.ratio)

    def withdraw(self) -> bool:
        if self.balance >= 1.0:
            self.balance -= 1.0
            return True
        return False


@dataclass
class Opened:
    response: httpx.Response
    lease: Lease
    ttfb_s: float


class Forwarder:
    def __init__(self, client_for: Callable[[Pool], httpx.AsyncClient],
                 budget_for: Callable[[Pool], RetryBudget],
                 on_error: Callable[[Pool, str], None], on_retry: Callable[[Pool], None]) -> None:
        self.client_for = client_for
        self.budget_for = budget_for
        self.on_error = on_error
        self.on_retry = on_retry

    async def open(self, pool: Pool, path: str, headers: list[tuple[str, str]], body: bytes,
                   *, method: str = "POST", header_timeout_s: float, degraded: bool = False) -> Opened:
        client = self.client_for(pool)
        budget = self.budget_for(pool)
        budget.deposit()
        tried = []
        started = time.perf_counter()
        for attempt in range(pool.spec.retry.attempts):
            last = attempt == pool.spec.retry.attempts - 1
            if attempt and not budget.withdraw():
                break
            if attempt:
                self.on_retry(pool)
            lease = pool.acquire(exclude=tried, degraded=degraded or bool(tried))
            tried.append(lease.endpoint)
            request = client.build_request(method, lease.endpoint.url + path, headers=headers, content=body)
            try:
                response = await asyncio.wait_for(client.send(request, stream=True), header_timeout_s)
            except asyncio.TimeoutError:
                lease.release(ok=False)
                self.on_error(pool, "timeout")
                raise UpstreamTimeout(f"pool '{pool.name}' sent no response within "
                                      f"{header_timeout_s:g} s") from None
            except httpx.TransportError as exc:
                lease.release(ok=False)
                self.on_error(pool, "connect")
                error: GatewayError = UpstreamUnreachable(
                    f"pool '{pool.name}' is unreachable: {type(exc).__name__}")
                if last:
                    raise error from None
                continue
            except BaseException:
                lease.release(ok=False)
                raise
            if response.status_code in RETRY_STATUSES and not last and budget.balance >= 1.0:
                await response.aclose()
                lease.release(ok=response.status_code == 429)
                self.on_error(pool, f"status_{response.status_code}")
                continue
            return Opened(response, lease, time.perf_counter() - started)
        raise UpstreamUnreachable(f"pool '{pool.name}' failed after {len(tried)} attempt(s)")


Finish = Callable[[int, bool], None]  # status code for the books, upstream finished cleanly
CLIENT_CLOSED = 499  # nginx's code for "the client went away first"


@dataclass
class Outcome:
    status: int
    ok: bool = False


async def _until_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(work: Awaitable[None], receive: Receive) -> bool:
    """Run `work`; cancel it if the client disconnects first. True when it finished."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        return False
    if task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
    return True


class _Relay:
    def __init__(self, opened: Opened, extra_headers: dict[str, str], deadline_s: float,
                 finish: Finish) -> None:
        self.opened = opened
        self.extra_headers = extra_headers
        self.deadline_s = deadline_s
        self.finish = finish

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = self.opened.response
        outcome = Outcome(response.status_code)
        try:
            if not await run_until_disconnect(self.relay(send, outcome), receive):
                outcome = Outcome(CLIENT_CLOSED)
        finally:
            await response.aclose()
            self.finish(outcome.status, outcome.ok)

    async def relay(self, send: Send, outcome: Outcome) -> None:
        raise NotImplementedError


class RelayBody(_Relay):
    """Non-streamed answer: read it whole, then send it with our headers."""

    async def relay(self, send: Send, outcome: Outcome) -> None:
        response = self.opened.response
        try:
            async with asyncio.timeout(self.deadline_s):
                content = await response.aread()
        except (httpx.HTTPError, TimeoutError) as exc:
            outcome.status = await _send_error(send, exc, started=False)
            return
        headers = response_headers(response.headers, self.extra_headers)
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content, "more_body": False})
        outcome.ok = True


class RelayStream(_Relay):
    """Server-sent events, relayed chunk by chunk as they arrive.

    While the first chunk is awaited, an SSE comment goes out every
    `keepalive_s` so idle-timeout proxies keep the connection open.
    """

    def __init__(self, opened: Opened, extra_headers: dict[str, str], deadline_s: float,
                 finish: Finish, *, keepalive_s: float, first_chunk_s: float) -> None:
        super().__init__(opened, extra_headers, deadline_s, finish)
        self.keepalive_s = keepalive_s
        self.first_chunk_s = first_chunk_s

    async def relay(self, send: Send, outcome: Outcome) -> None:
        response = self.opened.response
        headers = response_headers(response.headers, self.extra_headers)
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        chunks = response.aiter_raw()
        try:
            async with asyncio.timeout(self.deadline_s):
                first = await self._first_chunk(chunks, send)
                if first:
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                    async for chunk in chunks:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (httpx.HTTPError, TimeoutError) as exc:
            outcome.status = await _send_error(send, exc, started=True)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        outcome.ok = True

    async def _first_chunk(self, chunks: AsyncIterator[bytes], send: Send) -> bytes:
        next_chunk = asyncio.ensure_future(anext(chunks, b""))
        try:
            loop = asyncio.get_running_loop()
            give_up = loop.time() + self.first_chunk_s
            while True:
                wait = min(self.keepalive_s, give_up - loop.time())
                if wait <= 0:
                    raise TimeoutError
                done, _ = await asyncio.wait({next_chunk}, timeout=wait)
                if done:
                    return next_chunk.result()
                await send({"type": "http.response.body", "body": KEEPALIVE_COMMENT, "more_body": True})
        finally:
            if not next_chunk.done():
                next_chunk.cancel()


async def _send_error(send: Send, exc: BaseException, *, started: bool) -> int:
    timeout = isinstance(exc, (TimeoutError, httpx.TimeoutException))
    error = (UpstreamTimeout("the backend stopped sending within the pool's timeout") if timeout
             else UpstreamUnreachable(f"the backend connection broke: {type(exc).__name__}"))
    payload = json.dumps(error.body()).encode()
    if started:
        # Headers are gone already: end the event stream with an error event, as vLLM does.
        await send({"type": "http.response.body", "body": b"data: " + payload + b"\n\n",
                    "more_body": False})
        return error.status_code
    await send({"type": "http.response.start", "status": error.status_code,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
    return error.status_code
