"""A pool's connection slots: taken at once while free, waited for in turn past the limit,
never lost to a waiter that gave up, whether by its timeout or by cancellation."""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream.slots import Slots


def test_free_slots_are_taken_at_once_up_to_the_limit() -> None:
    slots = Slots(2)
    assert slots.take() and slots.take()
    assert not slots.take()
    slots.release()
    assert slots.take()


def test_a_pool_needs_a_slot() -> None:
    with pytest.raises(ValueError):
        Slots(0)


def test_waiters_get_released_slots_first_come_first_served() -> None:
    asyncio.run(_waiters_get_released_slots_first_come_first_served())


async def _waiters_get_released_slots_first_come_first_served() -> None:
    loop = asyncio.get_running_loop()
    slots, served = Slots(1), []
    assert slots.take()

    async def waiter(name: str) -> None:
        await slots.wait(loop, None)
        served.append(name)

    tasks = [asyncio.create_task(waiter(name)) for name in "abc"]
    while slots.waiting < 3:
        await asyncio.sleep(0)
    assert not slots.take()  # nobody passes the queue
    for task, expected in zip(tasks, (["a"], ["a", "b"], ["a", "b", "c"]), strict=True):
        slots.release()
        await task
        assert served == expected
    assert slots.free == 0 and slots.waiting == 0
    slots.release()
    assert slots.free == 1


def test_a_waiter_past_its_timeout_leaves_the_queue() -> None:
    asyncio.run(_a_waiter_past_its_timeout_leaves_the_queue())


async def _a_waiter_past_its_timeout_leaves_the_queue() -> None:
    loop = asyncio.get_running_loop()
    slots = Slots(1)
    assert slots.take()
    with pytest.raises(TimeoutError):
        await slots.wait(loop, 0.01)
    assert slots.waiting == 0
    slots.release()
    assert slots.free == 1 and slots.take()


def test_a_slot_handed_to_a_waiter_cancelled_at_that_moment_goes_to_the_next() -> None:
    asyncio.run(_a_slot_handed_to_a_waiter_cancelled_at_that_moment_goes_to_the_next())


async def _a_slot_handed_to_a_waiter_cancelled_at_that_moment_goes_to_the_next() -> None:
    loop = asyncio.get_running_loop()
    slots = Slots(1)
    assert slots.take()
    first = asyncio.create_task(slots.wait(loop, None))
    second = asyncio.create_task(slots.wait(loop, None))
    while slots.waiting < 2:
        await asyncio.sleep(0)
    slots.release()  # the slot is the first waiter's now ...
    first.cancel()  # ... which gives up before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert slots.waiting == 0  # the first passed it on as it left: the second holds it
    await second
    assert slots.free == 0
    slots.release()
    assert slots.free == 1


def test_a_cancelled_waiter_still_queued_leaves_the_queue() -> None:
    asyncio.run(_a_cancelled_waiter_still_queued_leaves_the_queue())


async def _a_cancelled_waiter_still_queued_leaves_the_queue() -> None:
    loop = asyncio.get_running_loop()
    slots = Slots(1)
    assert slots.take()
    waiting = asyncio.create_task(slots.wait(loop, None))
    while slots.waiting < 1:
        await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert slots.waiting == 0
    slots.release()
    assert slots.free == 1
