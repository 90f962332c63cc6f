"""The gateway's live state: the policy in force and the pools built from it.

`Runtime.apply(policy)` swaps in a new policy. Pools whose spec did not change
are kept as they are (connections, health, counters); changed pools get new
objects, and the old ones close their connections once their last request
is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx

from gateway.decide.policy import Policy, PoolSpec
from gateway.load import LoadReport
from gateway.upstream.pools import Pool
from gateway.upstream.proxy import RetryBudget
from gateway.upstream.transport import PooledTransport


def build_upstream(spec: PoolSpec) -> tuple[PooledTransport, httpx.AsyncClient]:
    """One connection pool per backend pool. The proxy's hot path calls the
    transport directly; health checks and /v1/models go through the client."""
    c, t = spec.connections, spec.timeouts
    limits = httpx.Limits(max_connections=c.max_connections, max_keepalive_connections=c.max_keepalive,
                          keepalive_expiry=c.keepalive_expiry_s)
    transport = PooledTransport(limits)
    return transport, httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(connect=t.connect_s, read=t.total_s, write=t.connect_s, pool=t.first_byte_s),
        follow_redirects=False,
        trust_env=False,
    )


class Runtime:
    def __init__(self, policy: Policy, reported: LoadReport | None = None) -> None:
        self.policy = policy
        self.reported = reported or LoadReport()
        self.pools: dict[str, Pool] = {}
        self._clients: dict[Pool, httpx.AsyncClient] = {}
        self._transports: dict[Pool, httpx.AsyncBaseTransport] = {}
        self._budgets: dict[Pool, RetryBudget] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self.apply(policy)

    def apply(self, policy: Policy) -> list[Pool]:
        """Install `policy`; returns the pools that are new."""
        old = self.pools
        pools: dict[str, Pool] = {}
        created: list[Pool] = []
        for name, spec in policy.pools.items():
            kept = old.get(name)
            if kept is not None and kept.spec == spec:
                pools[name] = kept
                continue
            pool = Pool(name, spec)
            self._transports[pool], self._clients[pool] = build_upstream(spec)
            self._budgets[pool] = RetryBudget(spec.retry.budget_ratio)
            pools[name] = pool
            created.append(pool)
        self.policy, self.pools = policy, pools
        for pool in old.values():
            if pools.get(pool.name) is not pool:
                self._retire(pool)
        return created

    def client_for(self, pool: Pool) -> httpx.AsyncClient:
        return self._clients[pool]

    def transport_for(self, pool: Pool) -> httpx.AsyncBaseTransport:
        return self._transports[pool]

    def budget_for(self, pool: Pool) -> RetryBudget:
        return self._budgets[pool]

    def load(self) -> Mapping[str, int]:
        """Each pool's load: the larger of this gateway's in-flight count and the
        backends' running + waiting as last reported."""
        reported = self.reported.snapshot()
        return {name: max(pool.in_flight, reported.get(name, 0)) for name, pool in self.pools.items()}

    async def aclose(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    def _retire(self, pool: Pool) -> None:
        try:
            task = asyncio.get_running_loop().create_task(self._close_when_idle(pool))
        except RuntimeError:  # no loop yet (start-up): nothing can be in flight
            self._clients.pop(pool, None)
            self._transports.pop(pool, None)
            self._budgets.pop(pool, None)
            return
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_when_idle(self, pool: Pool) -> None:
        deadline = pool.spec.timeouts.total_s
        waited = 0.0
        while pool.in_flight and waited < deadline:
            await asyncio.sleep(0.5)
            waited += 0.5
        client = self._clients.pop(pool, None)
        self._transports.pop(pool, None)
        self._budgets.pop(pool, None)
        if client is not None:
            await client.aclose()
