"""Traffic classes and the time per output token each class sees, per pool.

A class is a domain (from the policy's classifier) and a fixed temperature
band, written `domain/band` (gateway/policy/classes.py computes it). `ClassLatency` keeps a sliding window of
time-per-output-token per (class, pool), as measured on relayed streams
(gateway.upstream.meter), for the guard to compare.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ClassComparison:
    traffic_class: str
    speculative_s: float  # median time per output token on the speculative pool
    standard_s: float
    samples: tuple[int, int]

    @property
    def slower_pct(self) -> float:
        return (self.speculative_s / self.standard_s - 1) * 100 if self.standard_s > 0 else 0.0

    def to_json(self) -> dict[str, float | str | list[int]]:
        return {"class": self.traffic_class, "speculative_tpot_s": self.speculative_s,
                "standard_tpot_s": self.standard_s, "slower_pct": round(self.slower_pct, 3),
                "samples": list(self.samples)}


class ClassLatency:
    """Sliding windows of time-per-output-token by (class, pool). Bounded: at most
    `max_samples` per window and only the classes and pools the policy can produce."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_samples: int = 1024) -> None:
        self.clock = clock
        self.max_samples = max_samples
        self._windows: dict[tuple[str, str], deque[tuple[float, float]]] = {}

    def record(self, traffic_class: str, pool: str, seconds_per_token: float) -> None:
        window = self._windows.get((traffic_class, pool))
        if window is None:
            window = self._windows[(traffic_class, pool)] = deque(maxlen=self.max_samples)
        window.append((self.clock(), seconds_per_token))

    def samples(self, traffic_class: str, pool: str, window_s: float) -> list[float]:
        oldest = self.clock() - window_s
        window = self._windows.get((traffic_class, pool), deque())
        while window and window[0][0] < oldest:
            window.popleft()
        return [value for _, value in window]

    def classes(self) -> set[str]:
        return {traffic_class for traffic_class, _ in self._windows}

    def compare(self, speculative: str, standard: str, window_s: float, min_samples: int,
                classes: Iterable[str] | None = None) -> list[ClassComparison]:
        """Classes with at least `min_samples` on both pools, and their median TPOTs."""
        found = []
        for traffic_class in sorted(self.classes() if classes is None else classes):
            spec = self.samples(traffic_class, speculative, window_s)
            std = self.samples(traffic_class, standard, window_s)
            if len(spec) >= min_samples and len(std) >= min_samples:
                found.append(ClassComparison(traffic_class, statistics.median(spec), statistics.median(std),
                                             (len(spec), len(std))))
        return found
