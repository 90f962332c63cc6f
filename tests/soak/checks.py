"""Checks on what backends recorded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise


def backoff_violations(arrivals: Sequence[float], health: Mapping[str, float]) -> list[str]:
    """Arrivals (time.monotonic) at an endpoint that fails every request.

    After `eject_after` straight failures it is ejected: from then on it may
    see one trial per back-off, the back-off doubling up to `max_backoff_s`.
    Returns one line per arrival that came too soon."""
    problems = []
    backoff = health["backoff_s"]
    times = sorted(arrivals)
    eject_after = int(health["eject_after"])
    for index, (before, after) in enumerate(pairwise(times[eject_after - 1:])):
        if after - before < backoff - 0.001:
            problems.append(f"request {index + eject_after}: {after - before:.3f} s after the "
                            f"previous one, back-off {backoff:g} s")
        backoff = min(health["max_backoff_s"], backoff * 2)
    return problems
