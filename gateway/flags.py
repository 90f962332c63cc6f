"""Speculation flags per pool: the guard and the admin API write, routing reads.

A pool's flag has a manual `mode` and the guard's automatic verdict:

    force_on   speculation on, whatever the guard says
    force_off  nothing is sent to the pool, probes included
    auto       the guard decides; while it says off, a probe share still goes

Readers take `snapshot()`, an immutable mapping, so one request sees one
consistent state. Writers go through the store, which tells its listeners
(metrics, persistence) about every change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

# The bounded words flips are counted by (specgate_flag_flips_total{reason}).
FLIP_REASONS = frozenset({"initial", "low_acceptance", "latency_regression", "recovered", "stale",
                          "admin", "file", "restored", "manual"})


def reason_word(reason: str) -> str:
    """The metric label for a flag reason: its first word when known, else `manual`."""
    word = reason.split(":", 1)[0].strip()
    return word if word in FLIP_REASONS else "manual"


class Mode(str, Enum):
    AUTO = "auto"
    FORCE_ON = "force_on"
    FORCE_OFF = "force_off"


@dataclass(frozen=True)
class PoolFlag:
    mode: Mode = Mode.AUTO
    guard_enabled: bool = True
    reason: str = "initial"
    changed_at: float = 0.0
    disabled_classes: frozenset[str] = frozenset()  # traffic classes the guard keeps off the pool
    evidence: Mapping[str, float] = field(default_factory=dict, compare=False)  # numbers behind the reason

    @property
    def routable(self) -> bool:
        return self.mode is Mode.FORCE_ON or (self.mode is Mode.AUTO and self.guard_enabled)

    @property
    def probing(self) -> bool:
        return self.mode is Mode.AUTO and not self.guard_enabled

    def class_off(self, traffic_class: str) -> bool:
        """The guard took this class off the pool (auto mode only)."""
        return self.mode is Mode.AUTO and traffic_class in self.disabled_classes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mode": self.mode.value, "enabled": self.routable,
                "disabled_classes": sorted(self.disabled_classes), "evidence": dict(self.evidence)}


FlagSnapshot = Mapping[str, PoolFlag]
Listener = Callable[[str, PoolFlag, PoolFlag], None]  # pool, before, after


class FlagStore:
    def __init__(self, pools: Iterable[str], clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._flags: dict[str, PoolFlag] = {name: PoolFlag(changed_at=clock()) for name in pools}
        self._snapshot: FlagSnapshot = MappingProxyType(dict(self._flags))
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def snapshot(self) -> FlagSnapshot:
        return self._snapshot

    def get(self, pool: str) -> PoolFlag:
        return self._flags[pool]

    def set_mode(self, pool: str, mode: Mode, reason: str = "manual") -> PoolFlag:
        return self._update(pool, mode=mode, reason=reason)

    def set_guard(self, pool: str, enabled: bool, reason: str,
                  evidence: Mapping[str, float] | None = None) -> PoolFlag:
        return self._update(pool, guard_enabled=enabled, reason=reason, evidence=dict(evidence or {}))

    def set_classes(self, pool: str, classes: Iterable[str]) -> PoolFlag:
        """Traffic classes kept off the pool; the pool's own reason stays."""
        return self._update(pool, disabled_classes=frozenset(classes))

    def sync_pools(self, pools: Iterable[str]) -> None:
        """Keep flags of pools that still exist; add new pools; drop the rest."""
        names = list(pools)
        self._flags = {n: self._flags.get(n) or PoolFlag(changed_at=self._clock()) for n in names}
        self._snapshot = MappingProxyType(dict(self._flags))

    def _update(self, pool: str, **changes: Any) -> PoolFlag:
        before = self._flags[pool]
        after = replace(before, **changes, changed_at=self._clock())
        if ((after.mode, after.guard_enabled, after.disabled_classes)
                == (before.mode, before.guard_enabled, before.disabled_classes)):
            return before
        self._flags[pool] = after
        self._snapshot = MappingProxyType(dict(self._flags))
        for listener in self._listeners:
            listener(pool, before, after)
        return after
