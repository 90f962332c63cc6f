"""`Prediction`: one candidate's predicted times for one request, as the latency model reads them.

A plain class, built per candidate per request: mypyc compiles the `__init__` written out,
where a named tuple's `__new__` runs interpreted. Read-only by convention; two are equal
when their five numbers are.
"""

from __future__ import annotations


class Prediction:
    def __init__(self, ttft_s: float, tpot_s: float, e2e_s: float, samples: float, stddev_e2e: float) -> None:
        self.ttft_s = ttft_s
        self.tpot_s = tpot_s
        self.e2e_s = e2e_s
        self.samples = samples  # forgotten sample count behind the weaker of the two buckets read
        self.stddev_e2e = stddev_e2e  # standard error of e2e_s (the estimate's, not one request's spread)

    def values(self) -> tuple[float, float, float, float, float]:
        return self.ttft_s, self.tpot_s, self.e2e_s, self.samples, self.stddev_e2e

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Prediction) and self.values() == other.values()

    def __hash__(self) -> int:
        return hash(self.values())

    def __repr__(self) -> str:
        return "Prediction(ttft_s={}, tpot_s={}, e2e_s={}, samples={}, stddev_e2e={})".format(*self.values())
