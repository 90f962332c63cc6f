"""The gateway's admission gate: requests held while every candidate pool is past its objective.

A held request waits on one future, in order of priority (higher first),
then of the deadline of its own objective (the earliest first: a short answer
that cannot afford to wait before a long one that can), then arrival. Every
lease that comes back on a pool wakes the first held request that names it,
which routes again with the load as it is then; a request still over the
objectives is held again with what is left of its budget
(gateway/decide/admission.py). A held request whose budget runs out, or
whose client leaves, leaves the gate; nothing is ever refused here.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(order=True)
class _Held:
    rank: tuple[int, float, int]  # (-priority, due, arrival)
    pools: frozenset[str] = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class AdmissionGate:
    def __init__(self) -> None:
        self._held: list[_Held] = []
        self._arrivals = itertools.count()

    @property
    def held(self) -> int:
        return sum(1 for h in self._held if not h.future.done())

    def ahead(self, priority: int) -> int:
        """Held requests that a newcomer of `priority` would wait behind."""
        return sum(1 for h in self._held if not h.future.done() and -h.rank[0] >= priority)

    def rank(self, priority: int, due: float) -> tuple[int, float, int]:
        """A request's place: its priority, then when its objective falls due (`due`, on the
        loop's clock or any one clock all requests share), then its first arrival at the gate.
        A request woken but still over the objectives waits again in the place it had."""
        return -priority, due, next(self._arrivals)

    async def wait(self, pools: tuple[str, ...], rank: tuple[int, float, int], budget_s: float) -> bool:
        """Until a lease comes back on one of `pools` (True) or the budget runs out (False)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._held, _Held(rank, frozenset(pools), future))
        try:
            await asyncio.wait_for(asyncio.shield(future), budget_s)
            return True
        except TimeoutError:
            return False
        finally:
            if not future.done():
                future.cancel()
            self._prune()

    def released(self, pool: str) -> None:
        """A lease came back on `pool`: the first held request that names it goes."""
        for held in sorted(self._held):
            if not held.future.done() and pool in held.pools:
                held.future.set_result(None)
                return

    def _prune(self) -> None:
        while self._held and self._held[0].future.done():
            heapq.heappop(self._held)
        if len(self._held) > 64 and self.held < len(self._held) // 2:
            self._held = [h for h in self._held if not h.future.done()]
            heapq.heapify(self._held)
