"""What routing learns, merged across replicas: observations, not tables.

Each replica buffers its own latency observations (pool, class, load, TTFT,
TPOT) locally and, every `flush_s` (100 ms), appends them as one entry to a
shared Redis stream (XADD, trimmed to about `max_entries`) and reads the
entries added since its last id (XREAD), skipping its own. Each entry read
is fed to this replica's model through `apply`, exactly as a local
observation would be. Memory stays bounded: the local buffer holds at most
`max_buffered` observations (the oldest go first), an entry at most that
many, and the stream about `max_entries` entries.

A replica starts reading at the stream's tail (the history is not replayed:
the model would take old observations for new ones). The model forgets by
its own clock at the time it is fed, so another replica's observation counts
as made up to about two flush intervals (100-200 ms) later than it was: small
against the model's half-life. While Redis does not answer, observations
stay local and those made meanwhile are not shared later.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.state.background import Repeating
from gateway.state.store import StateStore

REPLICA, OBSERVATIONS = b"r", b"o"  # the fields of a stream entry


@dataclass(frozen=True)
class Observation:
    pool: str
    cls: str
    load: int
    ttft_s: float | None
    tpot_s: float | None

    def to_json(self) -> list[Any]:
        return [self.pool, self.cls, self.load, self.ttft_s, self.tpot_s]


def parsed(payload: bytes | str, limit: int) -> list[Observation]:
    """An entry's observations; anything malformed is left out (it was not written by a gateway)."""
    try:
        items = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return []
    if not isinstance(items, list):
        return []
    return [o for o in (_observation(item) for item in items[:limit]) if o is not None]


def _observation(item: object) -> Observation | None:
    if not isinstance(item, list) or len(item) != 5:
        return None
    pool, cls, load, ttft, tpot = item
    if not (isinstance(pool, str) and isinstance(cls, str) and isinstance(load, int) and not isinstance(load, bool)
            and load >= 0):
        return None
    if not (_seconds(ttft) and _seconds(tpot)):
        return None
    return Observation(pool, cls, load, ttft, tpot)


def _seconds(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool)
                             and 0.0 <= value < math.inf)


class SharedLearning:
    """Shares this replica's observations and feeds it the others', in a background task."""

    def __init__(self, store: StateStore, replica: str, apply: Callable[[Observation], None],
                 flush_s: float = 0.1, max_buffered: int = 1024, max_entries: int = 1000) -> None:
        if flush_s <= 0 or max_buffered < 1 or max_entries < 1:
            raise ValueError("flush_s > 0, max_buffered >= 1 and max_entries >= 1 are required")
        self.store = store
        self.replica = replica
        self.apply = apply
        self.flush_s = flush_s
        self.max_buffered = max_buffered
        self.max_entries = max_entries
        self.key = store.key("learning")
        self._buffer: deque[Observation] = deque(maxlen=max_buffered)
        self._last_id: bytes | str | None = None  # None: not placed at the tail yet
        self._loop = Repeating(store, "shared_learning", self.exchange, flush_s)
        self.sent = 0  # this replica's observations written to the stream
        self.received = 0  # others' observations fed to the model

    def record(self, observation: Observation) -> None:
        """A local observation, to be shared at the next flush (no I/O here)."""
        self._buffer.append(observation)

    async def exchange(self) -> None:
        """One flush and read: this replica's buffer out, the others' entries in."""
        if self._last_id is None:
            self._last_id = await self._tail()
        batch = [o.to_json() for o in self._buffer]
        self._buffer.clear()  # dropped if the write fails: observations made while Redis is down stay local
        last_id = self._last_id

        async def step(client: aioredis.Redis) -> list[Any]:
            async with client.pipeline(transaction=False) as pipe:
                if batch:
                    pipe.xadd(self.key, {REPLICA: self.replica, OBSERVATIONS: json.dumps(batch)},
                              maxlen=self.max_entries, approximate=True)
                pipe.xread({self.key: last_id}, count=self.max_entries)
                return list(await pipe.execute())

        results = await self.store.run("shared_learning", step)
        self.sent += len(batch)
        received = self.received
        self._take(results[-1])
        if self.store.metrics is not None:
            self.store.metrics.shared_observations.labels("sent").inc(len(batch))
            self.store.metrics.shared_observations.labels("received").inc(self.received - received)

    def _take(self, streams: Any) -> None:
        for _key, entries in streams or []:
            for entry_id, fields in entries:
                self._last_id = entry_id
                if _text(fields.get(REPLICA, b"")) == self.replica:
                    continue
                for observation in parsed(fields.get(OBSERVATIONS, b"[]"), self.max_buffered):
                    self.apply(observation)
                    self.received += 1

    async def _tail(self) -> bytes | str:
        """The id of the stream's newest entry, so reading starts after it."""
        newest: Any = await self.store.run("shared_learning", lambda client: client.xrevrange(self.key, count=1))
        entry_id: bytes | str = newest[0][0] if newest else b"0-0"
        return entry_id

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        await self._loop.stop()


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
