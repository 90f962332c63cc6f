"""Manual overrides (`PUT /admin/flags/{pool}`) shared by every gateway on one Redis.

Keys, under `specgate:{namespace}:`:

    overrides            hash: pool -> {"pool", "mode", "reason", "written_at", "version"} (JSON)
    overrides:version    the counter every write takes its version from (INCR)
    overrides:changed    the pub/sub channel every write is announced on

A write takes a new version, stores the entry and announces it in one script,
so the hash always holds each pool's newest override. Every replica applies
what it hears on the channel at once and reads the whole hash every
`full_read_s`, so a lost message (or a replica that was cut off) catches up
within that time. An announced entry older than the one applied is ignored;
what the hash holds is applied whatever its version (after the store lost its
data, versions start again from 1). The modes
land in the local `FlagStore`, which the request path reads: nothing there
waits for Redis. The guard's verdicts are not touched: a mode combines with
them as it does in one process (see `gateway/flags.py`).

Fail open: while Redis is down the last-known modes stay. An override set
then holds on this replica at once and is written, with a new version, when
Redis answers again.

A store that lost its data (restarted without persistence, flushed) is
written back: when a full read finds the hash without an override this
replica applied (there is no delete, so only a loss removes one), the replica
writes it again with its mode, reason and `written_at` and a new version, and
logs `overrides_lost_by_store` once. The write only fills a missing entry, so
replicas doing it at once draw one version per pool and agree on its mode.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.flags import FlagStore, Mode, PoolFlag
from gateway.state.store import STATE_ERRORS, StateStore

PART = "overrides"
LISTEN_WAIT_S = 0.5  # one wait for a pub/sub message; also how soon the listener sees a stop

# KEYS: version counter, hash, channel. ARGV: pool, mode, reason, written_at,
# and optionally "restore": write only when the hash has no entry for the pool
# (else return the one it has).
WRITE_SCRIPT = """
if ARGV[5] == 'restore' then
  local stored = redis.call('HGET', KEYS[2], ARGV[1])
  if stored then
    return stored
  end
end
local version = redis.call('INCR', KEYS[1])
local entry = cjson.encode({pool = ARGV[1], mode = ARGV[2], reason = ARGV[3], written_at = ARGV[4],
                            version = version})
redis.call('HSET', KEYS[2], ARGV[1], entry)
redis.call('PUBLISH', KEYS[3], entry)
return entry
"""


@dataclass(frozen=True)
class Override:
    pool: str
    mode: Mode
    reason: str
    version: int
    written_at: float  # the writer's wall clock when it wrote

    @classmethod
    def parse(cls, raw: bytes | str) -> Override | None:
        """An entry as stored; None for anything else (logged by the caller)."""
        try:
            data = json.loads(raw)
            return cls(pool=str(data["pool"]), mode=Mode(data["mode"]), reason=str(data["reason"]),
                       version=int(data["version"]), written_at=float(data["written_at"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Pending:
    mode: Mode
    reason: str


class SharedOverrides:
    def __init__(self, store: StateStore, flags: FlagStore, full_read_s: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.flags = flags
        self.full_read_s = full_read_s
        self.clock = clock
        self.hash_key = store.key("overrides")
        self.version_key = store.key("overrides", "version")
        self.channel = store.key("overrides", "changed")
        self.applied: dict[str, Override] = {}  # the newest override applied, per pool
        self.applied_at: dict[str, float] = {}  # when this replica applied it (wall clock)
        self.pending: dict[str, Pending] = {}  # set here while Redis was down, not yet written
        self.log = structlog.get_logger("specgate.state")
        self._script = store.client.register_script(WRITE_SCRIPT)
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        # The listener is asked to stop, not cancelled: the client can swallow a
        # cancellation that lands in a pub/sub read and read on.
        self._stopping = asyncio.Event()
        self._listening = False

    # Life ----------------------------------------------------------------------

    async def start(self, wait_s: float) -> None:
        """Read the stored overrides before serving when Redis answers within
        `wait_s`; then keep listening and reading in the background."""
        if await self.store.wait_up(wait_s):
            try:
                await self.sync()
            except STATE_ERRORS:
                pass  # recorded by the store; the loops below catch up
        self._tasks += [asyncio.create_task(self.store.repeat(PART, self.sync, self.full_read_s)),
                        asyncio.create_task(self.store.repeat(PART, self._listen, self.full_read_s))]

    async def aclose(self) -> None:
        self._stopping.set()
        deadline = asyncio.get_running_loop().time() + LISTEN_WAIT_S * 2
        while self._listening and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    # Writes --------------------------------------------------------------------

    async def set(self, pool: str, mode: Mode, reason: str) -> tuple[PoolFlag, bool]:
        """Set a pool's mode here at once and for every replica; the flag, and
        whether it reached Redis (else it is written when Redis is back)."""
        async with self._lock:
            flag = self.flags.set_mode(pool, mode, reason=reason)
            self.pending[pool] = Pending(mode, reason)
            try:
                await asyncio.wait_for(self._flush(pool), self.store.timeout_s * 2)
            except TimeoutError as exc:
                self.store.failed(PART, exc)
                return flag, self._unshared(pool, mode)
            except STATE_ERRORS:
                return flag, self._unshared(pool, mode)
            return flag, True

    def _unshared(self, pool: str, mode: Mode) -> bool:
        self.log.warning("override_not_shared_yet", pool=pool, mode=mode.value,
                         action="holds here; written when the state store answers")
        return False

    async def _flush(self, pool: str) -> None:
        pending = self.pending[pool]
        raw = await self._write([pool, pending.mode.value, pending.reason, repr(self.clock())])
        del self.pending[pool]
        override = Override.parse(raw)
        if override is not None:
            self._apply(override)

    async def _write(self, args: list[str]) -> bytes | str:
        keys = [self.version_key, self.hash_key, self.channel]
        raw: bytes | str = await self.store.run(
            PART, lambda client: self._script(keys=keys, args=args, client=client))
        return raw

    async def _restore(self, stored: Mapping[bytes | str, bytes | str]) -> None:
        """Write back the overrides applied here that the hash lost (see the module's doc)."""
        held = {key.decode() if isinstance(key, bytes) else key for key in stored}
        known = self.flags.snapshot()
        lost = [override for pool, override in self.applied.items() if pool not in held and pool in known]
        if not lost:
            return
        self.log.warning("overrides_lost_by_store", key=self.hash_key, pools=[o.pool for o in lost],
                         action="writing this replica's last-known overrides back")
        for override in lost:
            raw = await self._write([override.pool, override.mode.value, override.reason,
                                     repr(override.written_at), "restore"])
            self._apply_raw(raw, stored=True)  # this write, or the one another replica made first

    # Reads ---------------------------------------------------------------------

    async def sync(self) -> None:
        """Write what is pending, then read every stored override and apply the newer ones."""
        async with self._lock:
            for pool in list(self.pending):
                await self._flush(pool)
            stored: Mapping[bytes | str, bytes | str] = await self.store.run(
                PART, lambda client: client.hgetall(self.hash_key))
            for raw in stored.values():
                self._apply_raw(raw, stored=True)
            await self._restore(stored)

    async def _listen(self) -> None:
        """Subscribe and apply each announced override until the connection breaks."""
        pubsub = self.store.client.pubsub(ignore_subscribe_messages=True)
        try:
            await self.store.run(PART, lambda client: pubsub.subscribe(self.channel))
            await self.sync()  # what was written while no one listened
            self._listening = True
            while not self._stopping.is_set():
                try:  # not through `run`: a quiet channel says nothing about the server
                    message = await pubsub.get_message(timeout=LISTEN_WAIT_S)
                except STATE_ERRORS as exc:
                    self.store.failed(PART, exc)
                    raise
                if message is not None and message.get("type") == "message":
                    async with self._lock:
                        self._apply_raw(message["data"], stored=False)
        finally:
            self._listening = False
            await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # annotated from redis-py 8.2 on

    def _apply_raw(self, raw: bytes | str, stored: bool) -> None:
        override = Override.parse(raw)
        if override is None:
            self.log.warning("override_unreadable", key=self.hash_key, entry=str(raw)[:200])
            return
        self._apply(override, stored)

    def _apply(self, override: Override, stored: bool = True) -> None:
        """Apply an override read from the hash (`stored`: the newest there is, even
        when its version is lower than the one applied, as after the store lost its
        data) or announced (applied only when not older than the one applied).
        One this replica still has to write waits its turn."""
        current = self.applied.get(override.pool)
        if not stored and current is not None and override.version < current.version:
            return
        if override.pool in self.pending or override.pool not in self.flags.snapshot():
            return  # an unknown pool: applied by a later read if a reload adds it
        self.flags.set_mode(override.pool, override.mode, reason=override.reason)
        if current != override:
            self.applied_at[override.pool] = self.clock()
        self.applied[override.pool] = override

    def describe(self, pool: str) -> dict[str, Any]:
        """The shared override behind a pool's mode, for `GET /admin/flags`."""
        override = self.applied.get(pool)
        return {"version": override.version if override else None,
                "written_at": override.written_at if override else None,
                "applied_at": self.applied_at.get(pool), "pending": pool in self.pending,
                "store_up": self.store.up}

