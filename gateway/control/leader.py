"""One guard leads: a lease in the shared state store, renewed by its holder,
with a fencing token.

The lease is the key `specgate:{namespace}:guard:lease`, taken with
`SET key holder NX PX ttl`. Taking it also increments the counter
`...:guard:fence`; the new value is the holder's fencing token, which every
verdict it writes carries (see `gateway/control/verdicts.py`), so the writes of
an old leader that was paused past its lease are refused.

The holder renews every `renew_s` (by default a third of the TTL) with a script
that extends the lease only while it still holds the holder's own value. A
process counts itself the leader only until `ttl` after the last renewal it
sent: one that is cut off from the store, or paused, stops leading on its own
clock, at the latest when the store lets the lease expire. The others try to
take the lease at every renewal interval, so a new leader holds it within the
TTL plus one renewal interval after the old one died.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gateway.state.store import StateStore

# Take the lease and, only if it was free, draw the next fencing token.
ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
"""

# Extend the lease only while it still holds this holder's value.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Give the lease up only if it is still this holder's.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


# Awaited once the lease is taken, before the process leads (see `Leader`).
BeforeLeading = Callable[[], Awaitable[None]]


def holder_name() -> str:
    """Unique per process, readable in the store: host, pid and a random tail
    (every container's pid may be 1)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Leader:
    """Takes and keeps the guard's lease; `lead()` says whether this process leads now."""

    def __init__(self, store: StateStore, *, ttl_s: float = 3.0, renew_s: float | None = None,
                 holder: str | None = None, on_change: Callable[[bool], None] | None = None,
                 before_leading: BeforeLeading | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError("the lease TTL must be positive")
        self.store = store
        self.ttl_s = ttl_s
        self.renew_s = renew_s if renew_s is not None else ttl_s / 3
        if not 0 < self.renew_s < ttl_s:
            raise ValueError("the lease must be renewed more often than its TTL")
        self.holder = holder or holder_name()
        self.on_change = on_change
        # Awaited once the lease is taken, before this process leads: the verdicts
        # stored by the last leader become this guard's starting point.
        self.before_leading = before_leading
        self.clock = clock
        self.lease_key = store.key("guard", "lease")
        self.fence_key = store.key("guard", "fence")
        self.token: int | None = None  # the fencing token of the lease held, if any
        self.valid_until = 0.0  # on this process's clock: the lease held is safe to use until then
        self.terms = 0  # how many times this process took the lease
        self.log = structlog.get_logger("specgate.guard")
        self._acquire = store.client.register_script(ACQUIRE)
        self._renew = store.client.register_script(RENEW)
        self._release = store.client.register_script(RELEASE)
        self._was_leading = False

    def lead(self) -> int | None:
        """The fencing token while this process leads, else None. Checked on the local
        clock, so a process paused or cut off past its lease stops leading by itself."""
        leading = self.token is not None and self.clock() < self.valid_until
        self._note(leading)
        return self.token if leading else None

    @property
    def leading(self) -> bool:
        return self.lead() is not None

    async def run(self) -> None:
        """Keep or take the lease every `renew_s`, for ever (errors back off, never end it)."""
        await self.store.repeat("guard_lease", self.step, self.renew_s)

    async def step(self) -> None:
        """One round: renew the lease held, or try to take a free one."""
        sent = self.clock()
        ttl_ms = str(round(self.ttl_s * 1000))
        if self.token is not None:
            renewed = await self.store.run("guard_lease", lambda client: self._renew(
                keys=[self.lease_key], args=[self.holder, ttl_ms], client=client))
            if renewed:
                self.valid_until = sent + self.ttl_s
            else:
                self.step_down("lease_lost")
        if self.token is None:
            token = int(await self.store.run("guard_lease", lambda client: self._acquire(
                keys=[self.lease_key, self.fence_key], args=[self.holder, ttl_ms], client=client)))
            if token:
                if self.before_leading is not None:
                    await self.before_leading()
                self.token, self.valid_until, self.terms = token, sent + self.ttl_s, self.terms + 1
        self.lead()

    def step_down(self, reason: str) -> None:
        """Stop leading now (the lease went to another, or a fenced write was refused)."""
        if self.token is not None:
            self.log.info("guard_leader_stepped_down", holder=self.holder, token=self.token, reason=reason)
        self.token, self.valid_until = None, 0.0
        self._note(False)

    async def release(self) -> None:
        """At shutdown: free the lease so another takes over at once, not after the TTL."""
        if self.token is None:
            return
        self.step_down("shutdown")
        await self.store.run("guard_lease", lambda client: self._release(
            keys=[self.lease_key], args=[self.holder], client=client))

    def _note(self, leading: bool) -> None:
        if leading == self._was_leading:
            return
        self._was_leading = leading
        if leading:
            self.log.info("guard_leader_elected", holder=self.holder, token=self.token, ttl_s=self.ttl_s)
        if self.on_change is not None:
            self.on_change(leading)

    def status(self) -> dict[str, Any]:
        token = self.lead()
        return {
            "leader": token is not None,
            "holder": self.holder,
            "token": token if token is not None else self.token,
            "terms": self.terms,
            "lease_ttl_s": self.ttl_s,
            "renew_s": round(self.renew_s, 3),
            "lease_left_s": round(max(self.valid_until - self.clock(), 0.0), 3) if token is not None else None,
        }
