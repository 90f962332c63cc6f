"""`Wakeup`: asyncio.Event's set, clear and wait, which a request's body waits on."""

from __future__ import annotations

import asyncio

from gateway.edge.response_cycle import Wakeup


def test_a_wait_after_set_returns_at_once_and_one_before_it_waits_for_it() -> None:
    asyncio.run(_set_and_clear())


def test_a_cancelled_waiter_leaves_the_others_to_be_woken() -> None:
    asyncio.run(_one_cancelled())


async def _set_and_clear() -> None:
    wakeup = Wakeup(asyncio.get_running_loop())
    waiters = [asyncio.ensure_future(wakeup.wait()) for _ in range(2)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters) and not wakeup.is_set()
    wakeup.set()
    await asyncio.gather(*waiters)  # both woken
    await wakeup.wait()  # still set
    wakeup.clear()
    assert not wakeup.is_set()
    again = asyncio.ensure_future(wakeup.wait())
    await asyncio.sleep(0)
    assert not again.done()
    wakeup.set()
    await again


async def _one_cancelled() -> None:
    wakeup = Wakeup(asyncio.get_running_loop())
    gone, kept = asyncio.ensure_future(wakeup.wait()), asyncio.ensure_future(wakeup.wait())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    assert gone.cancelled() and not kept.done()
    wakeup.set()
    await kept
