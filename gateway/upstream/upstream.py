"""`Upstream`: one backend pool and what the gateway keeps to reach it."""

from __future__ import annotations

import httpx

from gateway.upstream.pools import Pool
from gateway.upstream.retry import RetryBudget
from gateway.upstream.transport import PooledTransport


class Upstream:
    """A pool with its connection pool (`transport`, which the proxy's hot path
    calls directly), an httpx client over it (for /v1/models) and its retry
    budget. One per pool of the policy in force."""

    def __init__(self, pool: Pool, transport: httpx.AsyncBaseTransport | None = None) -> None:
        c, t = pool.spec.connections, pool.spec.timeouts
        self.pool = pool
        self.transport = transport or PooledTransport(httpx.Limits(
            max_connections=c.max_connections, max_keepalive_connections=c.max_keepalive,
            keepalive_expiry=c.keepalive_expiry_s))
        self.client = httpx.AsyncClient(
            transport=self.transport,
            timeout=httpx.Timeout(connect=t.connect_s, read=t.total_s, write=t.connect_s, pool=t.first_byte_s),
            follow_redirects=False,
            trust_env=False,
        )
        self.budget = RetryBudget(pool.spec.retry.budget_ratio)

    @property
    def name(self) -> str:
        return self.pool.name

    async def aclose(self) -> None:
        await self.client.aclose()
