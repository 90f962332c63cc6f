"""One read timer for all of a connection's waits: a wait past its due time fails with its
expiry, a wait done in time is never failed later, a later wait due sooner re-arms it, and
one timer serves a run of waits due no sooner."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.upstream.read_timer import DeadlineReached, ReadTimer

SOON_S = 0.02


class CountingLoop:
    """The running loop, counting the timers asked of it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.armed = 0

    def time(self) -> float:
        return self.loop.time()

    def call_at(self, when: float, callback: Any) -> asyncio.TimerHandle:
        self.armed += 1
        return self.loop.call_at(when, callback)


def run(test: Any) -> Any:
    async def main() -> Any:
        loop = CountingLoop(asyncio.get_running_loop())
        return await test(loop, ReadTimer(loop))  # type: ignore[arg-type]  # the loop's timer methods only

    return asyncio.run(main())


@pytest.mark.parametrize("expiry", [httpx.ReadTimeout, DeadlineReached])
def test_a_wait_past_its_due_time_fails_with_its_expiry(expiry: type[httpx.ReadTimeout]) -> None:
    async def test(loop: CountingLoop, timer: ReadTimer) -> None:
        waiter = loop.loop.create_future()
        timer.watch(waiter, SOON_S, expiry)
        with pytest.raises(expiry):
            await waiter

    run(test)


def test_a_wait_done_in_time_is_not_failed_by_the_timer_left_armed() -> None:
    async def test(loop: CountingLoop, timer: ReadTimer) -> None:
        waiter = loop.loop.create_future()
        timer.watch(waiter, SOON_S, httpx.ReadTimeout)
        waiter.set_result(None)
        timer.unwatch()
        idle = loop.loop.create_future()  # a future nobody watches, past the due time
        loop.loop.call_later(SOON_S * 3, idle.set_result, None)
        await idle
        assert waiter.exception() is None

    run(test)


def test_a_later_wait_due_sooner_rearms_the_timer() -> None:
    async def test(loop: CountingLoop, timer: ReadTimer) -> None:
        first = loop.loop.create_future()
        timer.watch(first, 60.0, httpx.ReadTimeout)
        first.set_result(None)
        timer.unwatch()
        second = loop.loop.create_future()
        timer.watch(second, SOON_S, httpx.ReadTimeout)
        with pytest.raises(httpx.ReadTimeout):
            await second
        assert loop.armed == 2

    run(test)


def test_waits_due_no_sooner_share_one_timer_until_it_fires_and_rearms() -> None:
    async def test(loop: CountingLoop, timer: ReadTimer) -> None:
        for _ in range(20):  # a stream's chunks, each in time
            waiter = loop.loop.create_future()
            timer.watch(waiter, SOON_S * 5, httpx.ReadTimeout)
            loop.loop.call_soon(waiter.set_result, None)
            await waiter
            timer.unwatch()
        assert loop.armed == 1
        last = loop.loop.create_future()  # armed for an earlier wait: it fires, re-arms, then expires this one
        timer.watch(last, SOON_S * 5, httpx.ReadTimeout)
        with pytest.raises(httpx.ReadTimeout):
            await last
        assert loop.armed == 2

    run(test)


def test_a_closed_timer_fails_nothing() -> None:
    async def test(loop: CountingLoop, timer: ReadTimer) -> None:
        waiter = loop.loop.create_future()
        timer.watch(waiter, SOON_S, httpx.ReadTimeout)
        timer.close()
        loop.loop.call_later(SOON_S * 3, waiter.set_result, None)
        await waiter

    run(test)
