"""The latency model's tables: load buckets of exponentially forgetting means, and their fit.

A `_Series` is one metric's buckets for one (pool, class) pair or one pool's
curve; `Pair` holds TTFT's and step time's. The fit shrinks each bucket toward
an anchor (the prior, or the neighbours' level, or the pool's curve for a
class) and makes the table non-decreasing in load. latency.py says why.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any


def load_bucket(load: int, last: int) -> int:
    """0 -> 0, 1 -> 1, 2-3 -> 2, 4-7 -> 3, ..., capped at `last`."""
    bucket = load.bit_length() if load > 0 else 0
    return bucket if bucket < last else last


def bucket_label(index: int, last: int) -> str:
    if index < 2:
        return str(index)
    low = 1 << (index - 1)
    return f"{low}+" if index == last else f"{low}-{2 * low - 1}"


def bucket_load(index: int) -> float:
    """The load a bucket stands for in the priors: its middle."""
    return float(index) if index < 2 else 1.5 * (1 << (index - 1)) - 0.5


def between(table: list[float], load: float, centres: Sequence[float]) -> float:
    """A fitted table's value at `load`, on the line between the loads its buckets stand
    for (`centres`, increasing) around it; past the last one, on the last segment's slope
    (never below the last value)."""
    low = bisect_right(centres, load) - 1  # clamped by hand: builtins' calls cost on this path
    if low < 0:
        low = 0
    elif low > len(table) - 2:
        low = len(table) - 2
    x0, y0 = centres[low], table[low]
    value = y0 + (table[low + 1] - y0) * (load - x0) / (centres[low + 1] - x0)
    return y0 if load >= x0 and value < y0 else value


def highest_fitting(fits: Callable[[int], bool], below: int, start: int) -> int | None:
    """The highest load under `below` that `fits` (non-decreasing loads fit less), None where
    0 does not. `start`: the room found last time, when the load was past it (a room moves
    little from one decision to the next). A candidate above that room is most likely still
    past it: the loads just over it and at it are read first, so an unmoved room costs two
    reads (a room grown past the load: the load just over it, then the one just under
    `below`). Any other candidate reads the load just under `below` first: one within its
    room, the usual case, needs that one read. A room that moved is bracketed by doubling
    steps from where it was and the bracket bisected, so any room is found as a bisection
    of the whole range would find it. Load 0 is read only where nothing above it fits."""
    if below <= 0:
        return None
    high = below - 1
    low = None  # the highest load read that fits; `high` is one that does not from here on
    step = 1
    if 0 < start < high:
        if fits(start + 1):
            if start + 1 == high or fits(high):
                return high
            low = start + 1
            while low + step < high and fits(low + step):
                low, step = low + step, step * 2
            high = min(high, low + step)
        elif fits(start):
            return start
        else:
            high = start
            while high - step > 0 and not fits(high - step):
                high, step = high - step, step * 2
            if high - step > 0:  # the loop stopped on a load that fits
                low = high - step
    else:
        if fits(high):
            return high
        if high == 0:
            return None
    if low is None:
        if not fits(0):
            return None
        low = 0
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def highest_fitting_in_stretches(fits: Callable[[int], bool], below: int, start: int,
                                 firsts: Sequence[int]) -> int | None:
    """`highest_fitting` where loads fit less as they grow only within each stretch that starts
    at one of `firsts` (increasing; the first stretch starts at 0): each searched from the top
    stretch under `below` down, the first holding a load that fits giving it. A dynamic pool's
    drafts change at its switch: a class whose drafts collapsed fits just past it, not below."""
    top = below
    for first in reversed(firsts):
        if 0 < first < top:
            def shifted(load: int, first: int = first) -> bool:
                return fits(first + load)
            found = highest_fitting(shifted, top - first, start - first)
            if found is not None:
                return first + found
            top = first
    return highest_fitting(fits, top, start)


def isotonic(values: list[float], weights: list[float]) -> None:
    """Pool adjacent violators, in place: the nearest non-decreasing sequence by weight."""
    starts: list[int] = []
    means: list[float] = []
    masses: list[float] = []
    for i, (value, mass) in enumerate(zip(values, weights, strict=True)):
        start = i
        while means and means[-1] > value:
            before = masses.pop()
            value = (means.pop() * before + value * mass) / (before + mass)
            mass += before
            start = starts.pop()
        starts.append(start)
        means.append(value)
        masses.append(mass)
    starts.append(len(values))
    for block, mean in enumerate(means):
        values[starts[block]:starts[block + 1]] = [mean] * (starts[block + 1] - starts[block])


def anchors(means: list[float], weights: list[float], prior: list[float], lends: float) -> list[float]:
    """Per bucket, the prior scaled by the data/prior ratio of the nearest other
    buckets holding at least `lends` of forgotten weight (interpolated between the
    nearest below and above); else the bucket's own mean if it has any data; else
    the prior. A bucket gone stale stops lending its level to its neighbours."""
    n = len(prior)
    below = [-1] * n
    nearest = -1
    for b in range(n):
        below[b] = nearest
        if weights[b] >= lends:
            nearest = b
    anchors = list(prior)
    above = -1
    for b in range(n - 1, -1, -1):
        low = below[b]
        if low >= 0 and above >= 0:
            r_low, r_high = means[low] / prior[low], means[above] / prior[above]
            anchors[b] *= r_low + (r_high - r_low) * (b - low) / (above - low)
        elif low >= 0 or above >= 0:
            near = low if low >= 0 else above
            anchors[b] *= means[near] / prior[near]
        elif weights[b] > 0:  # no other bucket to go by: its own level, the prior's shape unknown
            anchors[b] = means[b]
        if weights[b] >= lends:
            above = b
    return anchors


class Series:
    """One metric's buckets for one pair: forgotten weight, mean, sum of squared
    deviations and last update per bucket, and the fitted table built from them."""
    __slots__ = ("weight", "mean", "squares", "at", "centre", "fit_mean", "fit_var", "fit_weight", "fit_lent", "fit_w0")

    def __init__(self, buckets: int) -> None:
        self.weight = [0.0] * buckets
        self.mean = [0.0] * buckets
        self.squares = [0.0] * buckets
        self.at = [0.0] * buckets
        self.centre = [bucket_load(b) for b in range(buckets)]  # the mean load of its answers, forgetting
        self.fit_mean: list[float] = []
        self.fit_var: list[float] = []
        self.fit_weight: list[float] = []  # the bucket's own forgotten weight at the fit
        self.fit_lent: list[float] = []  # the remembered weight its anchor borrowed from the pool's curve
        self.fit_w0 = 0.0  # the weight the anchor counts for on top, forgotten or not

    def add(self, load: int, value: float, now: float, decay_rate: float) -> None:
        """An answer that ran at `load`, into its bucket: West's weighted update after
        forgetting since the bucket's last sample, and the load the bucket stands for
        moved toward `load` by the same weight."""
        b = load_bucket(load, len(self.weight) - 1)
        keep = math.exp(decay_rate * (now - self.at[b])) if self.weight[b] > 0 else 0.0
        weight = self.weight[b] * keep + 1.0
        delta = value - self.mean[b]
        mean = self.mean[b] + delta / weight
        self.squares[b] = self.squares[b] * keep + delta * (value - mean)
        self.weight[b], self.mean[b], self.at[b] = weight, mean, now
        self.centre[b] += (load - self.centre[b]) / weight

    def forgotten(self, now: float, decay_rate: float) -> tuple[list[float], list[float]]:
        """Per bucket, the share of its weight still remembered at `now`, and the weight itself."""
        keeps = [math.exp(decay_rate * (now - at)) if weight > 0 else 0.0
                 for weight, at in zip(self.weight, self.at, strict=True)]
        return keeps, [weight * keep for weight, keep in zip(self.weight, keeps, strict=True)]

    def fit(self, anchors: list[float], anchor_vars: list[float], lent: list[float], w0: float, now: float,
            decay_rate: float) -> None:
        """Each bucket's mean shrunk toward its anchor, which counts for `lent` + `w0`
        samples of per-answer variance `anchor_vars`; then made non-decreasing."""
        keeps, weights = self.forgotten(now, decay_rate)
        means, variances, masses = [], [], []
        for weight, mean, squares, keep, anchor, anchor_var, borrowed in zip(
                weights, self.mean, self.squares, keeps, anchors, anchor_vars, lent, strict=True):
            total = weight + borrowed + w0
            means.append((weight * mean + (borrowed + w0) * anchor) / total)
            variances.append((squares * keep + (borrowed + w0) * anchor_var) / total)
            masses.append(total)
        isotonic(means, masses)
        self.fit_mean, self.fit_var, self.fit_weight, self.fit_lent, self.fit_w0 = means, variances, weights, lent, w0

    def read(self, b: int, keep: float) -> tuple[float, float, float]:
        """Bucket `b` of the fitted table `keep` later: mean, squared standard error,
        and the weight of answers behind it (its own and what the pool's curve lent)."""
        seen = (self.fit_weight[b] + self.fit_lent[b]) * keep
        return self.fit_mean[b], self.fit_var[b] / (seen + self.fit_w0), seen

    def to_json(self, keep: float) -> dict[str, list[Any]]:
        return {"samples": [round(w * keep, 3) for w in self.fit_weight],
                "observed_s": [m if w > 0 else None for m, w in zip(self.mean, self.weight, strict=True)],
                "fitted_s": self.fit_mean,
                "stderr_s": [math.sqrt(self.read(b, keep)[1]) for b in range(len(self.fit_mean))]}


class Pair:
    __slots__ = ("ttft", "tpot", "updated", "fitted_at", "pool_fitted_at")

    def __init__(self, buckets: int) -> None:
        self.ttft = Series(buckets)
        self.tpot = Series(buckets)
        self.updated = 0.0  # last observation
        self.fitted_at = -math.inf  # the last observation the fitted tables include
        self.pool_fitted_at = -math.inf  # the pool curve's fit the class's tables were anchored on

    def series(self) -> tuple[Series, Series]:
        return self.ttft, self.tpot


RATIO_WEIGHT = 0.25  # the answers' worth at the pool's level a class's ratio is shrunk toward 1 with


def class_anchor(own: Series, pool: Series, pool_keep: float, now: float, decay_rate: float, w0: float,
                  lends: float) -> tuple[list[float], list[float], list[float]]:
    """A class's anchors: the pool's curve scaled by how this class's own answers
    compare with it, each lending the pool bucket's remembered weight up to
    `lends`. The ratio forgets as the buckets do, so it follows a class whose
    drafts stop being accepted; it is shrunk toward 1 by only `RATIO_WEIGHT`
    answers, so a class that left a pool because it ran slow there drifts back
    toward the pool's mix slowly (two half-lives after its last three answers
    it keeps three quarters of its distance from 1)."""
    _, weights = own.forgotten(now, decay_rate)
    seen = sum(weights)
    observed = sum(w * m for w, m in zip(weights, own.mean, strict=True))
    expected = sum(w * p for w, p in zip(weights, pool.fit_mean, strict=True))
    level = expected / seen if seen > 0 else 0.0  # the ratio of sums, shrunk toward 1
    ratio = (observed + RATIO_WEIGHT * level) / (expected + RATIO_WEIGHT * level) if expected > 0 else 1.0
    return ([ratio * p for p in pool.fit_mean], [ratio * ratio * v for v in pool.fit_var],
            [min(w * pool_keep, lends) for w in pool.fit_weight])


