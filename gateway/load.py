"""The load the backends report per pool (running + waiting): the guard
publishes it after each check, routing reads it.

Readers take `snapshot()`, an immutable mapping replaced whole on every
publish, so one request sees one consistent view; a pool missing from it has
no reported load (unknown: the gateway's own in-flight count decides).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType


class LoadReport:
    def __init__(self) -> None:
        self._snapshot: Mapping[str, int] = MappingProxyType({})

    def publish(self, loads: Mapping[str, int]) -> None:
        self._snapshot = MappingProxyType(dict(loads))

    def clear(self) -> None:
        """Nothing is known any more (the source went unreadable)."""
        self.publish({})

    def snapshot(self) -> Mapping[str, int]:
        return self._snapshot
