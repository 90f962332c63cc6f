"""Priorities in a saturated pool: waiters woken highest first, then by
arrival; a full queue evicts its lowest waiter for a higher newcomer and
sheds a newcomer no higher than every waiter (429); `shed_below` and
`busy_load` shed low priorities at once; the metrics by tier."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import Shed
from gateway.upstream.claim import Claim
from gateway.upstream.pools import Pool
from gateway.upstream.proxy import Standing
from gateway.upstream.queue import Waiter, WaitQueue

from .test_queue import Waiting, make_pool, outbound, until


async def ask(w: Waiting, name: str, priority: int, load: dict[str, int] | None = None) -> Claim:
    claim = Claim()
    await w.forwarder.open_first(w.chain, outbound, claim, standing=Standing(priority, load or {}))
    w.served.append(name)
    return claim


async def queue_up(w: Waiting, pool: Pool, *asks: tuple[str, int]) -> list[asyncio.Task[Claim]]:
    """Requests that wait on `pool`, queued in the order given."""
    tasks: list[asyncio.Task[Claim]] = []
    for name, priority in asks:
        tasks.append(asyncio.create_task(ask(w, name, priority)))
        await until(lambda: pool.queue.waiting == len(tasks) or tasks[-1].done())
    return tasks


async def serve_one_by_one(holder: Claim, tasks: list[asyncio.Task[Claim]]) -> None:
    """Give the holder's slot back, then each served request's in turn."""
    current = holder
    pending = list(tasks)
    while True:
        await current.give_back(True)
        if not pending:
            return
        await until(lambda: any(t.done() for t in pending))
        done = next(t for t in pending if t.done())
        pending.remove(done)
        current = await done


def test_waiters_are_woken_highest_priority_first_then_in_arrival_order():
    pool = make_pool()
    w = Waiting(pool)

    async def main() -> None:
        holder = await ask(w, "holder", 0)
        tasks = await queue_up(w, pool, ("l1", -5), ("n1", 0), ("h1", 5), ("l2", -5), ("h2", 5), ("n2", 0))
        assert pool.queue.waiting == 6
        await serve_one_by_one(holder, tasks)

    asyncio.run(main())
    assert w.served == ["holder", "h1", "h2", "n1", "n2", "l1", "l2"]
    assert (pool.in_flight, pool.queue.waiting, pool.queue.handed) == (0, 0, 0)
    assert w.sample("specgate_priority_admitted_total", pool="p", tier="high") == 2
    assert w.sample("specgate_priority_admitted_total", pool="p", tier="normal") == 3
    assert w.sample("specgate_priority_queued_total", pool="p", tier="low") == 2
    assert w.sample("specgate_priority_wait_seconds_count", pool="p", tier="high") == 2


def test_a_full_queue_evicts_its_latest_lowest_waiter_for_a_higher_newcomer():
    pool = make_pool(queue={"max_waiting": 2, "max_wait_s": 4})
    w = Waiting(pool)

    async def main() -> Shed:
        holder = await ask(w, "holder", 0)
        l1, l2 = await queue_up(w, pool, ("l1", -1), ("l2", -1))
        high = asyncio.create_task(ask(w, "high", 3))
        with pytest.raises(Shed) as evicted:
            await l2  # evicted as `high` joins: the queue holds l1 and high
        assert pool.queue.waiting == 2 and not high.done()
        await serve_one_by_one(holder, [l1, high])
        return evicted.value

    error = asyncio.run(main())
    assert w.served == ["holder", "high", "l1"]
    assert error.status_code == 429 and error.code == "rate_limit_exceeded" and error.reason == "evicted"
    assert error.headers["retry-after"] == "4" and "higher priority" in error.message
    assert w.sample("specgate_priority_shed_total", pool="p", tier="low", reason="evicted") == 1
    assert w.sample("specgate_queue_waits_total", pool="p", outcome="evicted") == 1
    assert (pool.in_flight, pool.queue.waiting, pool.queue.handed) == (0, 0, 0)


@pytest.mark.parametrize("newcomer", [0, -1])
def test_a_newcomer_no_higher_than_every_waiter_of_a_full_queue_is_shed(newcomer):
    pool = make_pool(queue={"max_waiting": 2})
    w = Waiting(pool)

    async def main() -> Shed:
        holder = await ask(w, "holder", 0)
        tasks = await queue_up(w, pool, ("n1", 0), ("n2", 0))
        with pytest.raises(Shed) as shed:
            await ask(w, "newcomer", newcomer)
        await serve_one_by_one(holder, tasks)
        return shed.value

    error = asyncio.run(main())
    assert error.status_code == 429 and error.reason == "full"
    assert w.served == ["holder", "n1", "n2"]  # the waiters kept their places
    tier = "normal" if newcomer == 0 else "low"
    assert w.sample("specgate_priority_shed_total", pool="p", tier=tier, reason="full") == 1


def test_below_shed_below_a_full_pool_sheds_at_once_and_higher_ones_wait():
    pool = make_pool(priority={"shed_below": 0})
    w = Waiting(pool)

    async def main() -> Shed:
        holder = await ask(w, "holder", -3)  # a free slot is anyone's
        with pytest.raises(Shed) as shed:
            await ask(w, "low", -1)
        assert pool.queue.waiting == 0
        tasks = await queue_up(w, pool, ("normal", 0))
        await serve_one_by_one(holder, tasks)
        return shed.value

    error = asyncio.run(main())
    assert error.reason == "below_threshold" and "priority -1" in error.message
    assert w.served == ["holder", "normal"]
    assert w.sample("specgate_priority_shed_total", pool="p", tier="low", reason="below_threshold") == 1


def test_a_pool_busy_by_its_load_sheds_low_priorities_or_passes_them_down_the_chain():
    busy = make_pool("busy", limit=4, priority={"shed_below": 1, "busy_load": 8})
    alone, chained = Waiting(busy), Waiting(busy, make_pool("spare"))
    load = {"busy": 9}

    async def main() -> list[str]:
        with pytest.raises(Shed) as shed:
            await ask(alone, "normal", 0, load)
        assert shed.value.reason == "below_threshold"
        high = await ask(alone, "high", 1, load)  # the busy pool still takes what it does not shed
        passed = await ask(chained, "normal", 0, load)
        quiet = await ask(alone, "quiet", 0, {"busy": 7})
        pools = [c.pool.name for c in (high, passed, quiet)]
        for claim in (high, passed, quiet):
            await claim.give_back(True)
        return pools

    assert asyncio.run(main()) == ["busy", "spare", "busy"]
    assert busy.in_flight == 0


def test_a_woken_waiter_that_finds_no_slot_keeps_its_turn_among_its_priority():
    queue = WaitQueue("q", 8, 1.0, free=lambda: 0)

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        a, b, c = (Waiter(loop.create_future(), p) for p in (1, 1, 2))
        for waiter in (a, b, c):
            queue.join(waiter)
        queue.discard(a)
        queue.join(a, first=True)  # back, ahead of b but not of the higher c
        order = []
        while queue.waiting:
            first = queue._first()
            order.append([a, b, c].index(first))
            queue.discard(first)
        return order

    assert asyncio.run(main()) == [2, 0, 1]
