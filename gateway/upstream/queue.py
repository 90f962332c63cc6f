"""Waiting for a slot while every pool of a request's chain is at its in-flight limit.

Each pool has a `WaitQueue`: a bounded FIFO of `Waiter`s. A request that
finds every pool of its chain full joins the queue of each of those pools
that has room, and waits on one future: no polling. When a pool has room
again (a lease comes back, an endpoint recovers) it hands wake-ups to its
first waiters, as many as it has free slots. A wake-up is a ticket: until
its waiter has tried the pool, newcomers count the slot as taken, so it is
not lost to one of them. A woken waiter leaves every other queue it was in.

A waiter whose client leaves leaves every queue; if it had just been woken,
its wake-up passes on to the next waiter. A waiter still waiting at its
deadline gives up, and the request is answered 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence


class Waiter:
    """One request waiting on some pools' queues. Its future resolves to the
    queue whose pool woke it, or to None at its deadline."""
    __slots__ = ("future", "queues")

    def __init__(self, future: asyncio.Future[WaitQueue | None]) -> None:
        self.future = future
        self.queues: list[WaitQueue] = []

    def wake(self, queue: WaitQueue) -> bool:
        if self.future.done():
            return False
        queue.handed += 1
        self.future.set_result(queue)
        self.leave()
        return True

    def expire(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def leave(self) -> None:
        for queue in self.queues:
            queue.discard(self)
        self.queues.clear()


class WaitQueue:
    """One pool's waiters, first come first woken. `free()` says how many
    requests the pool takes now; `handed` counts wake-ups whose waiter has
    not tried the pool yet."""

    def __init__(self, pool: str, max_waiting: int, max_wait_s: float, free: Callable[[], int]) -> None:
        self.pool = pool
        self.max_waiting = max_waiting
        self.max_wait_s = max_wait_s
        self.free = free
        self.handed = 0
        self._waiters: OrderedDict[Waiter, None] = OrderedDict()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def has_room(self) -> bool:
        return len(self._waiters) < self.max_waiting

    def busy(self) -> bool:
        """Someone is ahead of a newcomer: a waiter, or a wake-up not yet used."""
        return bool(self._waiters) or self.handed > 0

    def join(self, waiter: Waiter, first: bool = False) -> None:
        """Queue `waiter` last, or `first` when it had been woken and found no
        slot after all: it keeps its turn."""
        self._waiters[waiter] = None
        if first:
            self._waiters.move_to_end(waiter, last=False)
        waiter.queues.append(self)

    def discard(self, waiter: Waiter) -> None:
        self._waiters.pop(waiter, None)

    def wake(self) -> None:
        """Hand wake-ups to the first waiters while the pool has slots no
        wake-up already counts on."""
        while self._waiters and self.handed < self.free():
            waiter, _ = self._waiters.popitem(last=False)
            waiter.wake(self)

    def flush(self) -> None:
        """Wake every waiter, slot or not: the pool cannot serve them (it lost
        its last usable endpoint) and they should hear so now."""
        while self._waiters:
            waiter, _ = self._waiters.popitem(last=False)
            waiter.wake(self)

    def redeem(self) -> None:
        """A woken waiter has tried the pool (or is gone): its slot is anyone's."""
        self.handed -= 1
        if self._waiters:
            self.wake()


class Ticket:
    """A wake-up from `queue`: redeem it once its pool was tried (again is a no-op)."""
    __slots__ = ("queue", "used")

    def __init__(self, queue: WaitQueue) -> None:
        self.queue = queue
        self.used = False

    def redeem(self) -> None:
        if not self.used:
            self.used = True
            self.queue.redeem()


async def wait(queues: Sequence[WaitQueue], deadline: float, first: bool = False) -> Ticket | None:
    """Wait on `queues` until one of them wakes the caller (its ticket) or
    the event-loop time `deadline` (None). Cancelled, the caller leaves every
    queue and passes on a wake-up it got."""
    loop = asyncio.get_running_loop()
    waiter = Waiter(loop.create_future())
    for queue in queues:
        queue.join(waiter, first)
    timer = loop.call_at(deadline, waiter.expire)
    try:
        woke = await waiter.future
        return None if woke is None else Ticket(woke)
    except asyncio.CancelledError:
        future = waiter.future
        if future.done() and not future.cancelled() and (woke := future.result()) is not None:
            woke.redeem()
        raise
    finally:
        timer.cancel()
        waiter.leave()
