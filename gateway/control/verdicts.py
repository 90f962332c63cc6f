"""The guard's verdicts, shared: the leader writes them, the others apply them.

After each check the leading guard writes its verdicts (per speculative pool:
on or off, the reason and its evidence, the traffic classes kept off) and the
backends' reported load to the hash `specgate:{namespace}:guard:verdicts`,
through a script that refuses the write unless the writer's fencing token is
the latest one issued (see `leader.py`); the hash keeps the token. After the
store lost its data the counter starts again, so a token from before the loss
is refused too (its holder steps down) and the next leader's is not fenced out
by a stored token from before. The script then publishes the token on the channel of the
same name.

A follower applies what is stored into its own flags and load report, as its
own guard would have: when a message arrives and at least every `read_s`, so a
lost message cannot leave it behind. While the store cannot be read it keeps
its flags as they are, and the reported load goes unknown (routing falls back
to the gateway's own count), as when the guard cannot read its source.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from redis.asyncio.client import PubSub

from gateway.control.leader import BeforeLeading, Leader
from gateway.flags import FlagStore, PoolFlag
from gateway.load import LoadReport
from gateway.state.store import STATE_ERRORS, StateStore

# Write only for the latest leader: the token must be the last one issued (a
# larger one was issued before the store lost its data, and is refused too).
WRITE = """
local issued = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) ~= issued then
  return 0
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'holder', ARGV[2], 'verdicts', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[1])
return 1
"""


def encode(pools: Mapping[str, PoolFlag], reported: Mapping[str, int]) -> str:
    """The guard's part of each pool's flag (never the manual mode) and the reported load."""
    return json.dumps({
        "published_at": time.time(),
        "pools": {name: {"guard_enabled": flag.guard_enabled, "reason": flag.reason,
                         "evidence": dict(flag.evidence), "disabled_classes": sorted(flag.disabled_classes)}
                  for name, flag in pools.items()},
        "reported_load": dict(reported),
    }, sort_keys=True)


class SharedVerdicts:
    """The guard's sink while it leads, and the follower's loop while it does not.

    It owns the lease: `leader` builds the `Leader` with the hook it awaits before
    leading, this object's `take_over`."""

    def __init__(self, store: StateStore, leader: Callable[[BeforeLeading], Leader], flags: FlagStore,
                 load: LoadReport, *, read_s: float = 1.0) -> None:
        self.store = store
        self.leader = leader(self.take_over)
        self.flags = flags
        self.load = load
        self.read_s = read_s
        self.key = store.key("guard", "verdicts")
        self.channel = self.key
        self.log = structlog.get_logger("specgate.guard")
        self.applying = False  # True while a follower writes the leader's verdicts into its flags
        self.written = 0
        self.refused = 0
        self.stored_token: int | None = None  # the token on the verdicts last read or written
        self.stored_holder: str | None = None
        self._write = store.client.register_script(WRITE)
        self._tasks: list[asyncio.Task[None]] = []

    async def take_over(self) -> None:
        """Start from the last leader's verdicts (after a restart of every process, too)."""
        with contextlib.suppress(*STATE_ERRORS):  # unread: this guard starts from its own flags
            await self.read()

    def start(self) -> None:
        """The lease loop and the follower's loop, in the background."""
        self._tasks = [asyncio.create_task(self.leader.run()), asyncio.create_task(self.run())]

    async def aclose(self) -> None:
        """Stop both loops and free the lease, so another guard leads at once."""
        await stop(self._tasks)
        self._tasks.clear()
        with contextlib.suppress(*STATE_ERRORS):
            await self.leader.release()

    # Leading -------------------------------------------------------------------

    async def publish(self, token: int, pools: Mapping[str, PoolFlag], reported: Mapping[str, int]) -> bool:
        """Write the verdicts under `token`; False when refused (the leader steps down)
        or when the store cannot be reached (the next check writes again)."""
        payload = encode(pools, reported)
        try:
            written = await self.store.run("guard_verdicts", lambda client: self._write(
                keys=[self.key, self.leader.fence_key],
                args=[str(token), self.leader.holder, payload, self.channel], client=client))
        except STATE_ERRORS:
            return False
        if not written:
            self.refused += 1
            self.log.info("guard_verdicts_refused", holder=self.leader.holder, token=token,
                          action="a newer leader holds the lease; following it")
            self.leader.step_down("fenced")
            return False
        self.written += 1
        self.stored_token, self.stored_holder = token, self.leader.holder
        return True

    # Following -----------------------------------------------------------------

    async def run(self) -> None:
        """Follow the stored verdicts for ever (errors back off, never end it)."""
        await self.store.repeat("guard_verdicts", self.follow, self.read_s)

    async def follow(self) -> None:
        """Listen on the channel and read at every message and every `read_s`; a failed
        read ends both (a silent connection is found out too), and `run` starts again."""
        pubsub = self.store.client.pubsub()
        woken = asyncio.Event()
        try:
            await self._follow(pubsub, woken)
        except STATE_ERRORS:
            if self.leader.lead() is None:
                self.load.clear()  # unknown now, as when the guard cannot read its source
            raise
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # annotated from redis-py 8.2 on

    async def _follow(self, pubsub: PubSub, woken: asyncio.Event) -> None:
        await pubsub.subscribe(self.channel)
        listener = asyncio.create_task(self._listen(pubsub, woken))
        try:
            while True:
                woken.clear()
                await self.read()
                waiter = asyncio.create_task(woken.wait())
                await asyncio.wait((waiter, listener), timeout=self.read_s, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if listener.done():
                    listener.result()  # its error ends the subscription
        finally:
            await stop([listener])

    @staticmethod
    async def _listen(pubsub: PubSub, woken: asyncio.Event) -> None:
        # timeout=None blocks without a read timeout, so cancelling it is clean
        while True:
            if await pubsub.get_message(ignore_subscribe_messages=True, timeout=None) is not None:
                woken.set()

    async def read(self) -> None:
        """Read the stored verdicts and, unless this process leads, apply them."""
        stored = await self.store.run("guard_verdicts", lambda client: client.hgetall(self.key))
        if not stored:
            return
        fields = {_text(k): _text(v) for k, v in stored.items()}
        self.stored_token, self.stored_holder = int(fields.get("token", "0")), fields.get("holder")
        if self.leader.lead() is not None:
            return
        self.apply(json.loads(fields.get("verdicts", "{}")))

    def apply(self, verdicts: Mapping[str, Any]) -> None:
        """The leader's verdicts into this process's flags and load report."""
        self.applying = True
        try:
            known = self.flags.snapshot()
            for name, verdict in verdicts.get("pools", {}).items():
                if name not in known:
                    continue  # a pool this process's policy does not have (a reload in between)
                self.flags.set_guard(name, bool(verdict["guard_enabled"]), str(verdict["reason"]),
                                     {k: float(v) for k, v in verdict.get("evidence", {}).items()})
                self.flags.set_classes(name, verdict.get("disabled_classes", ()))
            self.load.publish({name: int(load) for name, load in verdicts.get("reported_load", {}).items()})
        finally:
            self.applying = False

    def status(self) -> dict[str, Any]:
        return {"stored_token": self.stored_token, "stored_holder": self.stored_holder,
                "written": self.written, "refused": self.refused}


async def stop(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the tasks and wait for them to end, cancelling again any that swallowed
    the request (a cancel racing a read timeout inside the client can be lost)."""
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=0.1)
    await asyncio.gather(*tasks, return_exceptions=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
