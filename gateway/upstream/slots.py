"""`Slots`: at most so many requests in flight to one origin; the others wait their turn.

What `asyncio.Semaphore` does for the transport, in the request path's build: the
semaphore's `locked`, `acquire`, `release` and wake-up are five interpreted
frames a request, for a count that almost never reaches its bound. Here a free
slot is one comparison. A request that finds none waits, first come first
served, up to the pool timeout; a slot given back goes straight to the oldest
waiter still waiting, and one handed to a waiter that gave up at that moment is
passed on, never lost.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Slots:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a pool needs at least one connection slot")
        self.free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        """A slot at once if one is free (none is while anybody waits: a slot given back goes to a waiter)."""
        if self.free > 0:
            self.free -= 1
            return True
        return False

    async def wait(self, loop: asyncio.AbstractEventLoop, timeout: float | None) -> None:
        """A slot, in turn, within `timeout` seconds (None: no bound); past it, `TimeoutError`."""
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot as it gave up: the next one has it
            else:
                try:
                    self._waiters.remove(waiter)
                except ValueError:  # a release already passed over it
                    pass
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands: `free` stays
                return
        self.free += 1

    @property
    def waiting(self) -> int:
        return len(self._waiters)
