"""The fleet's load: what the other replicas have in flight, per pool and endpoint.

Each replica publishes its own counts to a hash of its own with a short TTL
(`ttl_s`, 2 s by default) and refreshes it every `refresh_s` (100 ms); a
replica that dies stops refreshing and its counts vanish with the TTL. The
same round trip reads every other live replica's hash and sums them into a
local snapshot, replaced whole: `others()` is an attribute read, so the
request path never waits on Redis. A decision adds this replica's live count
to the others' last published counts (its own published count is not in the
sum, so nothing is counted twice).

One refresh is one Lua script: it writes this replica's hash, marks the
replica live in a sorted set scored by Redis's own clock (so replicas' clocks
need not agree), drops the replicas not seen within the TTL and returns the
others' hashes. The others' counts are at most `refresh_s` old on each side
plus a round trip; while Redis does not answer, the last snapshot is kept
for one TTL, then dropped (the counts it holds would have expired anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gateway.state.background import Repeating
from gateway.state.store import STATE_ERRORS, StateStore

# KEYS[1]: the live replicas (sorted set), KEYS[2]: this replica's hash.
# ARGV[1]: this replica's id, ARGV[2]: the TTL in ms, ARGV[3]: the hashes' key
# prefix, ARGV[4...]: field, count, field, count, ...
_REFRESH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('DEL', KEYS[2])
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
local out = {}
for _, replica in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if replica ~= ARGV[1] then  -- an empty list for a replica with nothing in flight
    out[#out + 1] = redis.call('HGETALL', ARGV[3] .. replica)
  end
end
return out
"""

POOL, ENDPOINT = "p", "e"  # a hash field is "p\t<pool>" or "e\t<pool>\t<endpoint url>"


@dataclass(frozen=True)
class LocalCounts:
    """One replica's counts: per pool (in flight and waiting), per (pool, endpoint url) in flight."""
    pools: Mapping[str, int] = field(default_factory=dict)
    endpoints: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def fields(self) -> list[str]:
        """The non-zero counts as hash fields and values, flat."""
        flat: list[str] = []
        for pool, count in self.pools.items():
            if count:
                flat += [f"{POOL}\t{pool}", str(count)]
        for (pool, url), count in self.endpoints.items():
            if count:
                flat += [f"{ENDPOINT}\t{pool}\t{url}", str(count)]
        return flat


@dataclass(frozen=True)
class Elsewhere:
    """The other live replicas' counts, summed: what `others()` returns."""
    pools: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    endpoints: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: MappingProxyType({}))  # pool -> url -> n
    replicas: int = 0

    def pool(self, name: str) -> int:
        return self.pools.get(name, 0)

    def endpoint_counts(self, pool: str) -> Mapping[str, int]:
        return self.endpoints.get(pool, _NONE)


_NONE: Mapping[str, int] = MappingProxyType({})
NOWHERE = Elsewhere()


def nowhere() -> Elsewhere:
    """The other replicas' counts where there are none: a function of a compiled module,
    where a lambda of an interpreted one was a Python call on every request."""
    return NOWHERE


def summed(hashes: list[Any]) -> Elsewhere:
    """The replicas' hashes (flat field/value lists as HGETALL returns them), added up.
    A field or count that does not parse is skipped: it was not written by a gateway."""
    pools: dict[str, int] = {}
    endpoints: dict[str, dict[str, int]] = {}
    live = 0
    for flat in hashes:
        if not isinstance(flat, list):
            continue
        live += 1  # a live replica with nothing in flight has no hash: an empty list
        for raw_name, raw_count in zip(flat[::2], flat[1::2], strict=False):
            try:
                name, count = _text(raw_name), int(raw_count)
            except (UnicodeDecodeError, ValueError, TypeError):
                continue
            if count < 0:
                continue
            kind, _, rest = name.partition("\t")
            if kind == POOL:
                pools[rest] = pools.get(rest, 0) + count
            elif kind == ENDPOINT and "\t" in rest:
                pool, _, url = rest.partition("\t")
                by_url = endpoints.setdefault(pool, {})
                by_url[url] = by_url.get(url, 0) + count
    return Elsewhere(MappingProxyType(pools),
                     MappingProxyType({pool: MappingProxyType(urls) for pool, urls in endpoints.items()}), live)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class FleetLoad:
    """Publishes this replica's counts and keeps the others' sum, in a background task."""

    def __init__(self, store: StateStore, replica: str, local: Callable[[], LocalCounts],
                 refresh_s: float = 0.1, ttl_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        if refresh_s <= 0 or ttl_s <= refresh_s:
            raise ValueError("refresh_s > 0 and ttl_s > refresh_s are required")
        self.store = store
        self.replica = replica
        self.local = local
        self.refresh_s = refresh_s
        self.ttl_s = ttl_s
        self.clock = clock
        self._replicas_key = store.key("fleet", "replicas")
        self._hash_prefix = store.key("fleet", "load", "")
        self._script = store.client.register_script(_REFRESH)
        self._others = NOWHERE
        self._read_at = -float("inf")
        self.refreshes = 0  # successful publish-and-reads
        self._loop = Repeating(store, "fleet_load", self.refresh, refresh_s)

    def others(self) -> Elsewhere:
        """The other replicas' counts as last read (the request path's read)."""
        return self._others

    async def refresh(self) -> None:
        """One publish and read. A failure keeps the last snapshot for one TTL, then drops it."""
        keys = [self._replicas_key, self._hash_prefix + self.replica]
        args = [self.replica, str(round(self.ttl_s * 1000)), self._hash_prefix, *self.local().fields()]
        try:
            hashes = await self.store.run("fleet_load", lambda client: self._script(keys=keys, args=args))
        except STATE_ERRORS:
            if self.clock() - self._read_at > self.ttl_s:
                self._publish(NOWHERE)
            raise
        self._publish(summed(list(hashes)))
        self._read_at = self.clock()
        self.refreshes += 1

    def _publish(self, others: Elsewhere) -> None:
        self._others = others
        if self.store.metrics is not None:
            self.store.metrics.fleet_replicas.set(others.replicas)

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        """Stop refreshing and take this replica's counts out of the fleet's sum."""
        if not await self._loop.stop():
            return
        with contextlib.suppress(*STATE_ERRORS, TimeoutError):
            async with asyncio.timeout(self.store.timeout_s):
                await self.store.client.zrem(self._replicas_key, self.replica)
                await self.store.client.delete(self._hash_prefix + self.replica)
