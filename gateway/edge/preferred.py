"""Each class's preferred pool, and the log line that tells when it changes.

The preferred pool of a rule's traffic class is the one a `route: fastest`
decision found best by its predicted mean (`Fastest.best`). Under load two
close pools trade that place back and forth as their queues fill and drain,
many times a second; a line for each change would flood the log with what is
the balance working. So a class's line goes out at most once per `quiet_s`:

- the first change after a quiet period is logged at once;
- the changes within the period are counted; the first decision after it
  whose preferred pool differs from the one last logged logs that pool, with
  `changes`, how many changes the line stands for;
- changes that end on the pool last logged are no line: nothing changed.

So the log names a class's preferred pool within `quiet_s` of its settling,
while the class has traffic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from gateway.decide.fastest import Fastest

QUIET_S = 10.0  # at most one line per class in this long


@dataclass(slots=True)
class _Preference:
    best: str  # preferred by the latest decision
    logged: str  # named by the last line (or the first decision)
    at: float = -math.inf  # when that line went out
    changes: int = 0  # since that line


class PreferredPools:
    def __init__(self, quiet_s: float = QUIET_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.log = structlog.get_logger("specgate.routing")
        self.quiet_s = quiet_s
        self.clock = clock
        self._classes: dict[tuple[str, str], _Preference] = {}  # (rule, class); both bounded by the policy

    def note(self, rule: str, found: Fastest) -> None:
        """A decision's preferred pool; a line when that is a change to tell."""
        known = self._classes.get((rule, found.traffic))
        if known is None:
            self._classes[(rule, found.traffic)] = _Preference(found.best, found.best)
            return
        if found.best == known.best and not known.changes:
            return  # the usual case: nothing new, nothing pending
        if found.best != known.best:
            known.best = found.best
            known.changes += 1
        now = self.clock()
        if now - known.at < self.quiet_s:
            return
        if known.best != known.logged:
            self.log.info("preferred_pool_changed", rule=rule, traffic_class=found.traffic, before=known.logged,
                          after=known.best, changes=known.changes,
                          predicted_e2e={e.pool: round(e.predicted.e2e_s, 4) for e in found.estimates})
            known.logged, known.at = known.best, now
        known.changes = 0
