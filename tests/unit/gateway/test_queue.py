"""Waiting for a slot: FIFO order, the bound (429), the deadline, a client that
leaves, and a wake-up handed over to the next waiter when its waiter is gone."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.edge.load_view import DecisionLoad
from gateway.errors import AtCapacity, NoHealthyBackend, Shed
from gateway.policy.loader import parse_policy
from gateway.policy.pools import PoolSpec
from gateway.upstream.claim import Claim
from gateway.upstream.pools import Pool, queue_limits
from gateway.upstream.proxy import Forwarder, Outbound
from gateway.upstream.queue_metrics import QueueMetrics
from gateway.upstream.runtime import Runtime
from gateway.upstream.upstream import Upstream


def make_pool(name: str = "p", limit: int = 1, **spec) -> Pool:
    return Pool(name, PoolSpec(kind="standard", endpoints=[{"url": "http://127.0.0.1:9000"}],
                               max_in_flight=limit, **spec), rng=random.Random(7))


def upstream(pool: Pool) -> Upstream:
    return Upstream(pool, httpx.MockTransport(lambda request: httpx.Response(200, text="ok")))


def outbound(pool: Pool | None) -> Outbound:
    return Outbound("/v1/completions", [], b"{}", header_timeout_s=5.0)


class Waiting:
    """Requests sent through one forwarder; each keeps its claim until given back."""

    def __init__(self, *pools: Pool) -> None:
        self.chain = [upstream(pool) for pool in pools]
        self.metrics = QueueMetrics(CollectorRegistry())
        self.forwarder = Forwarder(on_error=lambda pool, kind: None, on_retry=lambda pool: None,
                                   waits=self.metrics)
        self.served: list[str] = []

    async def request(self, name: str, claim: Claim | None = None) -> Claim:
        claim = claim or Claim()
        await self.forwarder.open_first(self.chain, outbound, claim)
        self.served.append(name)
        return claim

    async def fill(self, pool: Pool, *names: str) -> tuple[Claim, list[asyncio.Task[Claim]]]:
        """A request that fills `pool` (its limit is 1), and `names` queued behind it."""
        holder = await self.request("holder")
        return holder, await self.queue(pool, *names)

    async def queue(self, pool: Pool, *names: str) -> list[asyncio.Task[Claim]]:
        """Requests that wait on `pool`, queued in the order named."""
        tasks = []
        for name in names:
            tasks.append(asyncio.create_task(self.request(name)))
            await until(lambda: pool.queue.waiting == len(tasks))
        return tasks

    def sample(self, metric: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(metric, labels)
        return 0.0 if value is None else value


async def until(check) -> None:
    """Let the other tasks run until `check()` holds: events, not time."""
    while not check():
        await asyncio.sleep(0)


def test_waiters_are_served_first_come_first_served_and_newcomers_queue_behind():
    pool = make_pool()
    w = Waiting(pool)

    async def main() -> None:
        holder, tasks = await w.fill(pool, "w0", "w1", "w2")
        assert w.sample("specgate_queue_waiting", pool="p") == 3
        await holder.give_back(True)
        with pytest.raises(AtCapacity):  # the freed slot is w0's, not a newcomer's
            pool.acquire()
        for i, task in enumerate(tasks):
            claim = await task
            assert w.served[-1] == f"w{i}"
            await claim.give_back(True)

    asyncio.run(main())
    assert w.served == ["holder", "w0", "w1", "w2"]
    assert (pool.in_flight, pool.queue.waiting, pool.queue.handed) == (0, 0, 0)
    assert w.sample("specgate_queue_waits_total", pool="p", outcome="served") == 3
    assert w.sample("specgate_queue_seconds_count", pool="p") == 3
    assert w.sample("specgate_queue_waiting", pool="p") == 0


def test_beyond_the_bound_the_answer_is_429_with_retry_after_at_once():
    pool = make_pool(queue={"max_waiting": 2, "max_wait_s": 7.5})
    w = Waiting(pool)

    async def main() -> Shed:
        holder, tasks = await w.fill(pool, "w0", "w1")
        with pytest.raises(Shed) as refused:
            await w.request("third")
        await holder.give_back(True)
        for task in tasks:
            await (await task).give_back(True)
        return refused.value

    error = asyncio.run(main())
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    assert error.headers["retry-after"] == "8"
    assert "queues are full" in error.message
    assert w.sample("specgate_queue_waits_total", pool="p", outcome="full") == 1
    assert w.sample("specgate_priority_shed_total", pool="p", tier="normal", reason="full") == 1
    assert pool.in_flight == 0


def test_a_waiter_past_its_deadline_gets_503_and_leaves_the_queue():
    pool = make_pool(queue={"max_wait_s": 0.01})
    w = Waiting(pool)

    async def main() -> AtCapacity:
        holder = await w.request("holder")
        with pytest.raises(AtCapacity) as late:
            await w.request("late")
        assert pool.queue.waiting == 0
        await holder.give_back(True)
        return late.value

    error = asyncio.run(main())
    assert "no slot came free" in error.message and error.headers["retry-after"] == "1"
    assert w.sample("specgate_queue_waits_total", pool="p", outcome="timeout") == 1
    assert (pool.in_flight, pool.queue.handed) == (0, 0)


def test_a_client_that_leaves_while_waiting_leaves_no_waiter_behind():
    pool = make_pool()
    w = Waiting(pool)

    async def main() -> None:
        holder, [gone] = await w.fill(pool, "gone")
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert pool.queue.waiting == 0
        await holder.give_back(True)
        assert pool.queue.handed == 0  # nobody to wake: the slot is free for anyone
        await (await w.request("next")).give_back(True)

    asyncio.run(main())
    assert w.sample("specgate_queue_waits_total", pool="p", outcome="cancelled") == 1
    assert w.sample("specgate_queue_waiting", pool="p") == 0


def test_a_wake_up_given_to_a_waiter_that_just_left_goes_to_the_next():
    pool = make_pool()
    w = Waiting(pool)

    async def main() -> None:
        holder, [first, second] = await w.fill(pool, "first", "second")
        await holder.give_back(True)  # wakes `first`, which has not run yet...
        assert pool.queue.handed == 1
        first.cancel()  # ...and is gone before it does
        with pytest.raises(asyncio.CancelledError):
            await first
        assert pool.queue.waiting == 0  # the wake-up went on to `second`
        await (await second).give_back(True)

    asyncio.run(main())
    assert w.served == ["holder", "second"]
    assert (pool.in_flight, pool.queue.waiting, pool.queue.handed) == (0, 0, 0)


def test_a_waiter_is_woken_by_any_pool_of_its_chain_and_leaves_the_others():
    first, second = make_pool("first"), make_pool("second")
    w = Waiting(first, second)

    async def main() -> None:
        a, b = await w.request("a"), await w.request("b")
        assert (a.pool, b.pool) == (first, second)
        waiting = asyncio.create_task(w.request("waiting"))
        await until(lambda: (first.queue.waiting, second.queue.waiting) == (1, 1))
        await b.give_back(True)  # a lease comes back on the fallback
        claim = await waiting
        assert claim.pool is second and first.queue.waiting == 0
        await claim.give_back(True)
        await a.give_back(True)

    asyncio.run(main())
    assert [p.in_flight for p in (first, second)] == [0, 0]


def test_an_unhealthy_pool_fails_fast_and_never_queues():
    pool = make_pool()
    pool.set_health(pool.endpoints[0], False)
    w = Waiting(pool)

    async def main() -> None:
        with pytest.raises(NoHealthyBackend) as failed:
            await w.request("r")
        assert not isinstance(failed.value, AtCapacity)

    asyncio.run(main())
    assert pool.queue.waiting == 0
    assert w.sample("specgate_queue_waits_total", pool="p", outcome="full") == 0


@pytest.mark.parametrize("spec,expected", [
    ({"max_in_flight": 64}, (256, 30.0)),  # the default policy: 64 running and 256 waiting per pool
    ({"max_in_flight": 100, "endpoints": 2}, (800, 30.0)),
    ({"max_in_flight": 8, "timeouts": {"first_byte_s": 5}}, (256, 5.0)),
    ({"max_in_flight": 8, "queue": {"max_waiting": 0, "max_wait_s": 2}}, (0, 2.0)),
])
def test_queue_defaults_follow_the_pool(spec, expected):
    endpoints = [{"url": f"http://127.0.0.1:{9000 + i}"} for i in range(spec.pop("endpoints", 1))]
    assert queue_limits(PoolSpec(kind="standard", endpoints=endpoints, **spec)) == expected


def test_the_load_routing_reads_counts_the_requests_waiting_for_a_pool():
    runtime = Runtime(parse_policy("version: 1\npools:\n  a: {kind: standard, max_in_flight: 1, "
                                   "endpoints: [{url: 'http://127.0.0.1:9000'}]}\nrules: [{name: all, route: a}]\n"))
    pool = runtime.pools["a"]
    w = Waiting(pool)
    decision_load = DecisionLoad(runtime)

    async def main() -> dict[str, int]:
        holder, tasks = await w.fill(pool, "w0", "w1")
        load = decision_load()
        await holder.give_back(True)
        for task in tasks:
            await (await task).give_back(True)
        return load

    assert asyncio.run(main()) == {"a": 3}
    assert decision_load() == {"a": 0}


def test_waiters_hear_at_once_when_their_pool_loses_its_last_healthy_endpoint():
    pool = make_pool()
    w = Waiting(pool)

    async def main() -> None:
        holder, [waiting] = await w.fill(pool, "waiting")
        pool.set_health(pool.endpoints[0], False)  # the active check fails: no slot will come
        with pytest.raises(NoHealthyBackend) as failed:
            await waiting
        assert not isinstance(failed.value, AtCapacity)
        await holder.give_back(None)

    asyncio.run(main())
    assert (pool.in_flight, pool.queue.waiting, pool.queue.handed) == (0, 0, 0)
    assert w.sample("specgate_queue_waits_total", pool="p", outcome="failed") == 1
