"""Replicas in one event loop sharing a real redis-server: each with its own
client, lease loop, flags and verdicts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.control.leader import Leader
from gateway.control.verdicts import SharedVerdicts, stop
from gateway.flags import FlagStore
from gateway.load import LoadReport
from gateway.state.store import StateStore
from tests.fakes.redis_server import RedisServer

TTL_S = 0.6
RENEW_S = 0.2


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with RedisServer(tmp_path / "redis") as server:
        yield server.url


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll until `predicate()` holds (the timeout only guards against a hang)."""
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"timed out after {timeout} s waiting for: {what}")


class Replica:
    """One process's view: its own client, its lease loop, its flags and verdicts."""

    def __init__(self, url: str, name: str, pools: tuple[str, ...] = ("spec",)) -> None:
        self.store = StateStore(url, namespace="t", timeout_s=0.5)
        self.changes: list[bool] = []
        self.flags = FlagStore(pools)
        self.load = LoadReport()
        self.verdicts = SharedVerdicts(self.store, lambda take_over: Leader(
            self.store, ttl_s=TTL_S, renew_s=RENEW_S, holder=name, on_change=self.changes.append,
            before_leading=take_over), self.flags, self.load, read_s=RENEW_S)
        self.leader = self.verdicts.leader
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.leader.run())

    async def leads(self) -> int:
        """Wait until this replica leads; its fencing token."""
        await wait_for(lambda: self.leader.lead() is not None, f"{self.leader.holder} leads")
        token = self.leader.lead()
        assert token is not None
        return token

    async def die(self) -> None:
        """Stop renewing without giving the lease up, as a killed process would."""
        if self.task is not None:
            await stop([self.task])

    async def aclose(self) -> None:
        await self.die()
        await self.store.aclose()


@asynccontextmanager
async def replicas(url: str, n: int, pools: tuple[str, ...] = ("spec",)) -> AsyncIterator[list[Replica]]:
    group = [Replica(url, f"r{i}", pools) for i in range(n)]
    try:
        yield group
    finally:
        for replica in group:
            await replica.aclose()


def leaders(group: list[Replica]) -> list[Replica]:
    return [r for r in group if r.leader.lead() is not None]
