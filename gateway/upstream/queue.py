"""Waiting for a slot while every pool of a request's chain is at its in-flight limit.

Each pool has a `WaitQueue`: a bounded queue of `Waiter`s, ordered by
priority (higher first), then by arrival. A request that finds every pool of
its chain full joins the queue of each of those pools that has room for it,
and waits on one future: no polling. When a pool has room again (a lease
comes back, an endpoint recovers) it hands wake-ups to its first waiters, as
many as it has free slots. A wake-up is a ticket: until its waiter has tried
the pool, newcomers count the slot as taken, so it is not lost to one of
them. A woken waiter leaves every other queue it was in.

A full queue still takes a newcomer of higher priority than its lowest
waiter: that waiter (the latest of the lowest priority) is evicted, leaves
every queue and is answered 429 (`Shed`). A newcomer no higher than every
waiter of a full queue is shed instead. So a request is never shed while one
of lower priority waits in its place.

A waiter whose client leaves leaves every queue; if it had just been woken,
its wake-up passes on to the next waiter. A waiter still waiting at its
deadline gives up, and the request is answered 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import Callable, Sequence

EVICTED = "evicted"  # what an evicted waiter's future resolves to


class Evicted(Exception):
    """Raised by `wait` to a waiter a newcomer of higher priority evicted."""


class Waiter:
    """One request waiting on some pools' queues. Its future resolves to the
    queue whose pool woke it, to None at its deadline, or to EVICTED."""
    __slots__ = ("future", "priority", "queues")

    def __init__(self, future: asyncio.Future[WaitQueue | str | None], priority: int = 0) -> None:
        self.future = future
        self.priority = priority
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

    def evict(self) -> None:
        if not self.future.done():
            self.future.set_result(EVICTED)
        self.leave()

    def leave(self) -> None:
        for queue in self.queues:
            queue.discard(self)
        self.queues.clear()


class WaitQueue:
    """One pool's waiters, highest priority first, then first come first
    woken. `free()` says how many requests the pool takes now; `handed`
    counts wake-ups whose waiter has not tried the pool yet."""

    def __init__(self, pool: str, max_waiting: int, max_wait_s: float, free: Callable[[], int]) -> None:
        self.pool = pool
        self.max_waiting = max_waiting
        self.max_wait_s = max_wait_s
        self.free = free
        self.handed = 0
        self._levels: list[int] = []  # the priorities that have waiters, ascending
        self._by_level: dict[int, OrderedDict[Waiter, None]] = {}
        self._count = 0

    @property
    def waiting(self) -> int:
        return self._count

    def has_room(self) -> bool:
        return self._count < self.max_waiting

    def takes(self, priority: int) -> bool:
        """Room for a newcomer of `priority`: a free place, or a waiter of
        lower priority to evict for it."""
        return self.has_room() or (bool(self._levels) and self._levels[0] < priority)

    def busy(self) -> bool:
        """Someone is ahead of a newcomer: a waiter, or a wake-up not yet used."""
        return self._count > 0 or self.handed > 0

    def join(self, waiter: Waiter, first: bool = False) -> None:
        """Queue `waiter` after those of its priority, or `first` among them
        when it had been woken and found no slot after all: it keeps its turn.
        A full queue evicts its lowest waiter for it (see `takes`)."""
        if not self.has_room() and self._levels and self._levels[0] < waiter.priority:
            self._lowest().evict()
        level = self._by_level.get(waiter.priority)
        if level is None:
            level = self._by_level[waiter.priority] = OrderedDict()
            bisect.insort(self._levels, waiter.priority)
        level[waiter] = None
        if first:
            level.move_to_end(waiter, last=False)
        self._count += 1
        waiter.queues.append(self)

    def discard(self, waiter: Waiter) -> None:
        level = self._by_level.get(waiter.priority)
        if level is None or waiter not in level:
            return
        del level[waiter]
        self._count -= 1
        if not level:
            del self._by_level[waiter.priority]
            self._levels.remove(waiter.priority)

    def wake(self) -> None:
        """Hand wake-ups to the first waiters while the pool has slots no
        wake-up already counts on."""
        while self._count and self.handed < self.free():
            self._first().wake(self)

    def flush(self) -> None:
        """Wake every waiter, slot or not: the pool cannot serve them (it lost
        its last usable endpoint) and they should hear so now."""
        while self._count:
            self._first().wake(self)

    def redeem(self) -> None:
        """A woken waiter has tried the pool (or is gone): its slot is anyone's."""
        self.handed -= 1
        if self._count:
            self.wake()

    def _first(self) -> Waiter:
        return next(iter(self._by_level[self._levels[-1]]))

    def _lowest(self) -> Waiter:
        return next(reversed(self._by_level[self._levels[0]]))


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


async def wait(queues: Sequence[WaitQueue], deadline: float, first: bool = False,
               priority: int = 0) -> Ticket | None:
    """Wait on `queues` until one of them wakes the caller (its ticket) or
    the event-loop time `deadline` (None); raises `Evicted` when a newcomer
    of higher priority takes the caller's place. Cancelled, the caller leaves every
    queue and passes on a wake-up it got."""
    loop = asyncio.get_running_loop()
    waiter = Waiter(loop.create_future(), priority)
    for queue in queues:
        queue.join(waiter, first)
    timer = loop.call_at(deadline, waiter.expire)
    try:
        woke = await waiter.future
        if isinstance(woke, WaitQueue):
            return Ticket(woke)
        if woke == EVICTED:
            raise Evicted
        return None
    except asyncio.CancelledError:
        future = waiter.future
        if future.done() and not future.cancelled() and isinstance(woke := future.result(), WaitQueue):
            woke.redeem()
        raise
    finally:
        timer.cancel()
        waiter.leave()
