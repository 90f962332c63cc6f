"""`Claim`: the one owner of what a request holds upstream (a lease, a
response); giving the claim back returns them whatever raised on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gateway.upstream.answer import Answer
from gateway.upstream.pools import Endpoint, Lease, Pool
from gateway.upstream.prompt_key import PromptKey


class Claim:
    """What one request holds upstream, with a single owner: at most one lease
    and the response it got. `give_back(ok)` closes the response and releases
    the lease (`ok`: True worked, False failed, None says nothing of the
    endpoint); the owner calls it once more at the end, whatever raised.

    `on_lease(pool, +1 | -1)` follows every lease taken and given back (the
    in-flight gauge), so the gauge and `Pool.in_flight` always agree.
    `pool` is the pool tried last and `fallback` why the request left the
    pool it was routed to, if it did.
    """

    def __init__(self, on_lease: Callable[[Pool, int], None] = lambda pool, delta: None) -> None:
        self.on_lease = on_lease
        self.lease: Lease | None = None
        self.response: Answer | None = None
        self.pool: Pool | None = None
        self.fallback: str | None = None
        self.waited_s: float | None = None  # how long the request waited in the pools' queues, if it did

    def take(self, pool: Pool, exclude: Iterable[Endpoint], degraded: bool, admitted: bool = False,
             key: PromptKey | None = None) -> Lease:
        if self.lease is not None:
            raise RuntimeError("a claim holds one lease at a time: give it back first")
        lease = self.lease = pool.acquire(exclude=exclude, degraded=degraded, admitted=admitted, key=key)
        self.on_lease(pool, 1)
        return lease

    async def give_back(self, ok: bool | None, why: str = "failed") -> None:
        response, self.response = self.response, None
        lease, self.lease = self.lease, None
        try:
            if response is not None:
                await response.aclose()
        finally:
            if lease is not None:
                try:
                    lease.release(ok, why)
                finally:
                    self.on_lease(lease.pool, -1)
