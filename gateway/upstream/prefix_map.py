"""`LruMap`: which endpoint last took a prompt block (or a session), bounded.

One per pool and kind of key. An approximate map: it remembers where the
gateway sent a prefix, not what the backend still caches, and forgets the
least recently sent entries past `bound`. Keys are 64-bit hashes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class LruMap(Generic[T]):
    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._owners: OrderedDict[int, T] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def get(self, key: int) -> T | None:
        return self._owners.get(key)

    def matches(self, blocks: Sequence[int], usable: Container[T]) -> dict[T, int]:
        """Each usable owner's longest match: the number of leading blocks up to
        the last one it owns. The scan stops at the first block nobody owns
        (each hash covers the whole prefix before it: nothing later can match)."""
        found: dict[T, int] = {}
        owners = self._owners
        for i, block in enumerate(blocks):
            owner = owners.get(block)
            if owner is None:
                break
            if owner in usable:
                found[owner] = i + 1
        return found

    def record(self, keys: Sequence[int], owner: T) -> None:
        """`keys` now belong to `owner`, the most recently used; the oldest beyond the bound go."""
        owners = self._owners
        for key in keys:
            owners[key] = owner
            owners.move_to_end(key)
        while len(owners) > self.bound:
            owners.popitem(last=False)
