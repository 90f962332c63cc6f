"""Forwarding to a pool, with retries before the first byte.

`Forwarder.open` sends the request to an endpoint of the pool and returns
once response headers arrive. Connect errors and 429/502/503/504 answers are
retried on another endpoint while attempts and the pool's retry budget last;
nothing is retried once a byte has gone to the client (see relay.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

from gateway.errors import UpstreamTimeout, UpstreamUnreachable
from gateway.pools import Endpoint, Lease, Pool

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})
# Also dropped from responses: the gateway's own server sets these.
RESPONSE_DROP = HOP_BY_HOP | {"date", "server"}
RETRY_STATUSES = frozenset({429, 502, 503, 504})


def request_headers(headers: Iterable[tuple[str, str]], extra: dict[str, str],
                    drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Headers for the backend: the client's, less hop-by-hop, routing and `drop`, plus `extra`."""
    kept = [(k, v) for k, v in headers if (name := k.lower()) not in HOP_BY_HOP and name not in extra
            and name not in drop and not name.startswith("x-specgate-")]
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
    def __init__(self, transport_for: Callable[[Pool], httpx.AsyncBaseTransport],
                 budget_for: Callable[[Pool], RetryBudget],
                 on_error: Callable[[Pool, str], None], on_retry: Callable[[Pool], None]) -> None:
        self.transport_for = transport_for
        self.budget_for = budget_for
        self.on_error = on_error
        self.on_retry = on_retry

    async def open(self, pool: Pool, path: str, headers: list[tuple[str, str]], body: bytes,
                   *, method: str = "POST", header_timeout_s: float, deadline: float | None = None,
                   degraded: bool = False) -> Opened:
        """`deadline` (event-loop time) bounds the whole exchange, body included."""
        transport = self.transport_for(pool)
        t = pool.spec.timeouts
        # The transport applies "read" to the wait for headers and to every later read:
        # no separate timer per request on the hot path.
        timeouts = {"connect": t.connect_s, "read": header_timeout_s, "write": t.connect_s,
                    "pool": t.first_byte_s}
        budget = self.budget_for(pool)
        budget.deposit()
        tried: list[Endpoint] = []
        started = time.perf_counter()
        attempts = pool.spec.retry.attempts
        while True:
            lease = pool.acquire(exclude=tried, degraded=degraded)
            tried.append(lease.endpoint)
            request = httpx.Request(method, lease.endpoint.url_for(path), headers=headers, content=body,
                                    extensions={"timeout": timeouts, "deadline": deadline})
            try:
                response = await transport.handle_async_request(request)
            except (httpx.ReadTimeout, httpx.PoolTimeout):
                lease.release(ok=False)
                self.on_error(pool, "timeout")
                raise UpstreamTimeout(f"pool '{pool.name}' sent no response within "
                                      f"{header_timeout_s:g} s") from None
            except httpx.TransportError as exc:
                lease.release(ok=False)
                self.on_error(pool, "connect")
                if not self._may_retry(pool, tried, attempts, budget, degraded):
                    raise UpstreamUnreachable(f"pool '{pool.name}' is unreachable after {len(tried)} "
                                              f"attempt(s): {type(exc).__name__}") from None
                continue
            except BaseException:
                lease.release(ok=False)
                raise
            if response.status_code in RETRY_STATUSES and self._may_retry(pool, tried, attempts, budget,
                                                                          degraded):
                await response.aclose()
                lease.release(ok=response.status_code == 429)  # busy is not broken
                self.on_error(pool, f"status_{response.status_code}")
                continue
            return Opened(response, lease, time.perf_counter() - started)

    def _may_retry(self, pool: Pool, tried: list[Endpoint], attempts: int, budget: RetryBudget,
                   degraded: bool = False) -> bool:
        """Another attempt needs attempts left, an endpoint not tried yet that is
        available (an ejected one waits for its back-off; in degraded mode any
        endpoint not full will do), and budget."""
        now = pool.clock()
        usable = [e for e in pool.endpoints if e not in tried
                  and (not e.full() if degraded else e.available(now))]
        if len(tried) >= attempts or not usable:
            return False
        if not budget.withdraw():
            return False
        self.on_retry(pool)
        return True
