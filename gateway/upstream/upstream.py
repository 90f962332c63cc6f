"""`Upstream`: one backend pool and what the gateway keeps to reach it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx

from gateway.upstream.answer import Answer
from gateway.upstream.pools import Pool
from gateway.upstream.retry import RetryBudget
from gateway.upstream.target import Target
from gateway.upstream.transport import PooledTransport


class Upstream:
    """A pool with its connection pool (`transport`, which the proxy's hot path
    calls directly through `send`), an httpx client over it (for /v1/models)
    and its retry budget. One per pool of the policy in force."""

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
        self._pooled = self.transport if isinstance(self.transport, PooledTransport) else None

    async def send(self, method: str, target: Target, headers: Sequence[tuple[str, str]], body: bytes,
                   timeouts: Mapping[str, float | None], deadline: float | None) -> Answer:
        """One request to one of the pool's endpoints, its response's headers read. Any
        other httpx transport (a test's `MockTransport`) is reached through an
        `httpx.Request`, whose encoding errors are the same `UnicodeEncodeError`s."""
        if self._pooled is not None:
            return await self._pooled.send(method, target, headers, body, timeouts, deadline)
        request = httpx.Request(method, target.url, headers=headers, content=body,
                                extensions={"timeout": dict(timeouts), "deadline": deadline})
        return Answer.of(await self.transport.handle_async_request(request))

    @property
    def name(self) -> str:
        return self.pool.name

    async def aclose(self) -> None:
        await self.client.aclose()
