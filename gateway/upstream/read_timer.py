"""The read timeout of a backend connection's waits, one timer for all of them.

A timer per wait (`call_later`, then `cancel` when the bytes come) cost a stream a
timer for every chunk. A `ReadTimer` is armed for a wait's due time and stays armed
when the wait ends: a later wait due no sooner keeps it, one due sooner re-arms it.
When it fires it expires the wait it was armed for, re-arms for a wait due later, or
lapses while the connection is idle. What a late wait raises is unchanged: the
backend's silence is `httpx.ReadTimeout`, the request's own deadline `DeadlineReached`.
"""

from __future__ import annotations

import asyncio

import httpx


class DeadlineReached(httpx.ReadTimeout):
    """A read cut by the request's own deadline, not by the backend's silence."""


Expiry = type[httpx.ReadTimeout]  # what a read that waited too long raises


class ReadTimer:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0  # when the armed handle fires
        self._waiter: asyncio.Future[None] | None = None  # the wait under way, if any
        self._due = 0.0
        self._expiry: Expiry = httpx.ReadTimeout

    def watch(self, waiter: asyncio.Future[None], timeout: float, expiry: Expiry) -> None:
        """`waiter` fails with `expiry` unless it is done within `timeout` seconds."""
        self._waiter, self._due, self._expiry = waiter, self._loop.time() + timeout, expiry
        if self._handle is None or self._at > self._due:
            self._arm()

    def unwatch(self) -> None:
        """The wait is over; the timer stays armed for the next."""
        self._waiter = None

    def close(self) -> None:
        self._waiter = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = self._due
        self._handle = self._loop.call_at(self._due, self._fire)

    def _fire(self) -> None:
        self._handle = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # idle: the next wait arms it again
        if self._at < self._due:  # armed for an earlier wait's due time
            self._arm()
            return
        message = ("the request's total time is up" if self._expiry is DeadlineReached
                   else "no data from the server within the read timeout")
        waiter.set_exception(self._expiry(message))
