"""FleetLoad and SharedLearning against a real Redis, without a gateway around
them: the TTL, the bounded stream, and what each keeps while Redis is down."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.state.fleet_load import NOWHERE, FleetLoad, LocalCounts
from gateway.state.shared_learning import Observation, SharedLearning
from gateway.state.store import STATE_ERRORS, StateStore
from tests.fakes.redis_server import RedisServer

pytestmark = pytest.mark.slow  # a real redis-server


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))
    return run


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


@contextlib.asynccontextmanager
async def two_stores(url: str, **options: Any) -> AsyncIterator[tuple[StateStore, StateStore]]:
    """Two replicas' stores on one Redis."""
    a, b = StateStore(url, **options), StateStore(url, **options)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


def counts(n: int) -> LocalCounts:
    return LocalCounts({"spec": n}, {("spec", "http://h:1"): n})


@in_loop
async def test_the_others_counts_exclude_this_replicas_and_expire_with_their_ttl(redis_server: RedisServer):
    async with two_stores(redis_server.url) as (a, b):
        fa = FleetLoad(a, "a", lambda: counts(3), refresh_s=0.05, ttl_s=0.5)
        fb = FleetLoad(b, "b", lambda: counts(1), refresh_s=0.05, ttl_s=0.5)
        await fa.refresh()
        await fb.refresh()
        assert (fb.others().pool("spec"), dict(fb.others().endpoint_counts("spec"))) == (3, {"http://h:1": 3})
        await fa.refresh()
        assert fa.others().pool("spec") == 1  # b's, not a's own 3 again
        while await b.client.exists("specgate:default:fleet:load:a"):  # a stops refreshing: a dead replica
            await asyncio.sleep(0.05)
        await fb.refresh()
        assert (fb.others().pool("spec"), fb.others().replicas) == (0, 0)


@in_loop
async def test_a_closed_replica_takes_its_counts_out_at_once(redis_server: RedisServer):
    async with two_stores(redis_server.url) as (a, b):
        fa = FleetLoad(a, "a", lambda: counts(2), refresh_s=0.05, ttl_s=5.0)
        fb = FleetLoad(b, "b", lambda: counts(0), refresh_s=0.05, ttl_s=5.0)
        fa.start()
        while fa.refreshes == 0:
            await asyncio.sleep(0.01)
        await fb.refresh()
        assert fb.others().pool("spec") == 2
        await fa.aclose()
        await fb.refresh()
        assert (fb.others().pool("spec"), fb.others().replicas) == (0, 0)


@in_loop
async def test_while_redis_is_down_the_last_counts_hold_for_one_ttl_then_go(redis_server: RedisServer):
    async with two_stores(redis_server.url, timeout_s=0.2) as (a, b):
        now = [0.0]
        fa = FleetLoad(a, "a", lambda: counts(3))
        fb = FleetLoad(b, "b", lambda: counts(0), ttl_s=2.0, clock=lambda: now[0])
        await fa.refresh()
        await fb.refresh()
        redis_server.kill()
        now[0] = 1.0
        with pytest.raises(STATE_ERRORS):
            await fb.refresh()
        assert fb.others().pool("spec") == 3  # within the TTL: the last-known counts
        now[0] = 2.5
        with pytest.raises(STATE_ERRORS):
            await fb.refresh()
        assert fb.others() is NOWHERE  # they would have expired in Redis by now
        assert not b.up


@in_loop
async def test_the_stream_stays_bounded_and_a_replica_skips_its_own_entries(redis_server: RedisServer):
    async with two_stores(redis_server.url) as (a, b):
        got_a: list[Observation] = []
        got_b: list[Observation] = []
        la = SharedLearning(a, "a", got_a.append, max_buffered=4, max_entries=10)
        lb = SharedLearning(b, "b", got_b.append, max_buffered=4, max_entries=10)
        await la.exchange()
        await lb.exchange()
        for load in range(6):  # more than the buffer holds: the oldest two go
            la.record(Observation("spec", "chat", load, 0.1, 0.01))
        await la.exchange()
        await lb.exchange()
        assert [o.load for o in got_b] == [2, 3, 4, 5]
        assert got_a == []
        for _ in range(200):
            la.record(Observation("spec", "chat", 1, 0.1, 0.01))
            await la.exchange()
        assert await a.client.xlen(a.key("learning")) < 200  # trimmed near max_entries
        late = SharedLearning(b, "late", got_b.append)
        await late.exchange()
        assert late.received == 0  # a new replica starts at the tail: old entries are not replayed
