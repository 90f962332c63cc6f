"""Predicted latency per (pool, traffic class) as a function of the pool's load.

    predicted E2E = TTFT(load) + expected output tokens x TPOT(load + 1)

`load` is the pool's load when the request was dispatched (the gateway's
in-flight count, or the backends' running + waiting). TTFT is kept by that
load; TPOT by the batch the request decoded in, itself included (load + 1), so
a prediction reads both where they were written.

Per pool, and per (pool, class), there is a fixed table of load buckets (0, 1,
2-3, 4-7, ..., the last one open), each holding an exponentially forgetting
mean and variance of TTFT and of TPOT. Forgetting is by time, not by samples: a
sample's weight halves every `half_life_s`. The model then follows a pool whose
draft degrades in a fixed time whatever the request rate (three half-lives of
10 s leave 12.5% of the weight on what came before), where a per-sample factor
would follow in seconds on a busy class and in minutes on a quiet one. A
bucket's weight (its forgotten sample count) also shrinks while it sees
nothing, so a stale estimate grows uncertain: `route: fastest` adds a floor of
exploration (fastest.py) to try a stale pool again.

Two levels, because a class's answers are few and spread over load buckets
while its pool's are many. The pool's curve takes every answer of the pool,
whatever its class. A pool bucket's estimate is its own mean shrunk toward an
anchor worth `LatencyPriors.weight` samples: the prior curve scaled by how the
nearest other buckets holding at least that much weight compare with it
(interpolated between the one below and the one above), the bucket's own mean
when no other has data, or the prior itself while the pool has none. A stale
bucket (its weight forgotten) slides toward what its neighbours see now.

A class's estimate in a bucket is its own answers there shrunk toward the
pool's curve, scaled by how this class's answers compare with the pool's in
the buckets it has (the ratio of sums, shrunk toward 1): code at T=0 that runs
1.5x faster than the pool's mix is predicted 1.5x faster at every load, from
its first few answers. The anchor counts for the prior's weight plus the pool
bucket's remembered weight, up to `pool_lends` samples, so an unseen load or a
new class reads the pool's measured curve rather than the prior, and stays as
fresh as the pool is. Tables are made non-decreasing in load (weighted
pool-adjacent-violators): a pool is not faster under more load.
Fitting is O(buckets) (~50-100 us for a pool and a class) and
happens on the first prediction after an observation, at most once per
`refit_s` of a pair's data (a burst shares one refit; 0.1 s is nothing against
a 10 s half-life); `observe` is O(1) and a prediction is a table lookup.
Memory is bounded: `buckets` per pair and `max_pairs` pairs, the least
recently updated dropped first.

Called from the event loop only: nothing here awaits, so no locks.
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from gateway.decide.latency_priors import LatencyPriors

__all__ = ["LatencyModel", "LatencyPriors", "Prediction", "bucket_label", "load_bucket"]


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_s: float
    tpot_s: float
    e2e_s: float
    samples: float  # forgotten sample count behind the weaker of the two buckets read
    stddev_e2e: float  # standard error of e2e_s (the estimate's, not one request's spread)


def load_bucket(load: int, last: int) -> int:
    """0 -> 0, 1 -> 1, 2-3 -> 2, 4-7 -> 3, ..., capped at `last`."""
    return min(load.bit_length(), last) if load > 0 else 0


def bucket_label(index: int, last: int) -> str:
    if index < 2:
        return str(index)
    low = 1 << (index - 1)
    return f"{low}+" if index == last else f"{low}-{2 * low - 1}"


def _bucket_load(index: int) -> float:
    """The load a bucket stands for in the priors: its middle."""
    return float(index) if index < 2 else 1.5 * (1 << (index - 1)) - 0.5


def _isotonic(values: list[float], weights: list[float]) -> None:
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


def _anchors(means: list[float], weights: list[float], prior: list[float], lends: float) -> list[float]:
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


class _Series:
    """One metric's buckets for one pair: forgotten weight, mean, sum of squared
    deviations and last update per bucket, and the fitted table built from them."""
    __slots__ = ("weight", "mean", "squares", "at", "fit_mean", "fit_var", "fit_weight", "fit_lent", "fit_w0")

    def __init__(self, buckets: int) -> None:
        self.weight = [0.0] * buckets
        self.mean = [0.0] * buckets
        self.squares = [0.0] * buckets
        self.at = [0.0] * buckets
        self.fit_mean: list[float] = []
        self.fit_var: list[float] = []
        self.fit_weight: list[float] = []  # the bucket's own forgotten weight at the fit
        self.fit_lent: list[float] = []  # the remembered weight its anchor borrowed from the pool's curve
        self.fit_w0 = 0.0  # the weight the anchor counts for on top, forgotten or not

    def add(self, b: int, value: float, now: float, decay_rate: float) -> None:
        """West's weighted update after forgetting since the bucket's last sample."""
        keep = math.exp(decay_rate * (now - self.at[b])) if self.weight[b] > 0 else 0.0
        weight = self.weight[b] * keep + 1.0
        delta = value - self.mean[b]
        mean = self.mean[b] + delta / weight
        self.squares[b] = self.squares[b] * keep + delta * (value - mean)
        self.weight[b], self.mean[b], self.at[b] = weight, mean, now

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
        _isotonic(means, masses)
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


class _Pair:
    __slots__ = ("ttft", "tpot", "updated", "fitted_at", "pool_fitted_at")

    def __init__(self, buckets: int) -> None:
        self.ttft = _Series(buckets)
        self.tpot = _Series(buckets)
        self.updated = 0.0  # last observation
        self.fitted_at = -math.inf  # the last observation the fitted tables include
        self.pool_fitted_at = -math.inf  # the pool curve's fit the class's tables were anchored on

    def series(self) -> tuple[_Series, _Series]:
        return self.ttft, self.tpot


RATIO_WEIGHT = 0.25  # the answers' worth at the pool's level a class's ratio is shrunk toward 1 with


def _class_anchor(own: _Series, pool: _Series, pool_keep: float, now: float, decay_rate: float, w0: float,
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


class LatencyModel:
    """TTFT and TPOT by load bucket per pool, and per (pool, traffic class) in
    the pool's shape, learned online."""

    def __init__(self, speculative_pools: Iterable[str] = (), priors: LatencyPriors | None = None,
                 half_life_s: float = 10.0, buckets: int = 12, max_pairs: int = 512, refit_s: float = 0.1,
                 pool_lends: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if half_life_s <= 0 or buckets < 2 or max_pairs < 1 or refit_s < 0 or pool_lends < 0:
            raise ValueError("half_life_s > 0, buckets >= 2, max_pairs >= 1, refit_s >= 0 and pool_lends >= 0 "
                             "are required")
        self.priors = priors or LatencyPriors()
        self.half_life_s = half_life_s
        self.max_pairs = max_pairs
        self.refit_s = refit_s
        self.pool_lends = pool_lends
        self.speculative_pools = frozenset(speculative_pools)
        self._buckets = buckets
        self._last = buckets - 1
        self._decay_rate = -math.log(2) / half_life_s
        self._clock = clock
        self._pairs: OrderedDict[tuple[str, str], _Pair] = OrderedDict()
        self._pools: dict[str, _Pair] = {}  # every answer of the pool, whatever its class
        self._unseen: dict[str, _Pair] = {}  # per pool, a class with no answers yet, anchored on its curve
        loads = [_bucket_load(b) for b in range(buckets)]
        self._prior_tables = {
            speculative: ([self.priors.ttft(load) for load in loads],
                          [self.priors.tpot(load, speculative) for load in loads])
            for speculative in (False, True)}
        self._scale = [1.0, 1.0]  # measured over prior, TTFT and TPOT, across the pools that answered
        self._cold = {speculative: self._fit_pool(_Pair(buckets), speculative) for speculative in (False, True)}

    def __len__(self) -> int:
        return len(self._pairs)

    def observe(self, pool: str, cls: str, load: int, ttft_s: float | None, tpot_s: float | None) -> None:
        """One answered request; a missing, negative or non-finite measure is left out."""
        key = (pool, cls)
        pair = self._pairs.get(key)
        if pair is None:
            pair = self._pairs[key] = _Pair(self._buckets)
            if len(self._pairs) > self.max_pairs:
                self._pairs.popitem(last=False)
        else:
            self._pairs.move_to_end(key)
        curve = self._pools.get(pool)
        if curve is None:
            curve = self._pools[pool] = _Pair(self._buckets)
        now = self._clock()
        for target in (pair, curve):
            if ttft_s is not None and 0.0 <= ttft_s < math.inf:
                target.ttft.add(load_bucket(load, self._last), ttft_s, now, self._decay_rate)
            if tpot_s is not None and 0.0 <= tpot_s < math.inf:
                target.tpot.add(load_bucket(load + 1, self._last), tpot_s, now, self._decay_rate)
            target.updated = now

    def predict(self, pool: str, cls: str, load: int, expected_tokens: float) -> Prediction:
        pair = self._current(pool, cls)
        keep = math.exp(self._decay_rate * (self._clock() - pair.fitted_at)) if pair.fitted_at > -math.inf else 1.0
        ttft, ttft_var, ttft_seen = pair.ttft.read(load_bucket(load, self._last), keep)
        tpot, tpot_var, tpot_seen = pair.tpot.read(load_bucket(load + 1, self._last), keep)
        variance = ttft_var + expected_tokens * expected_tokens * tpot_var
        return Prediction(ttft, tpot, ttft + expected_tokens * tpot, min(ttft_seen, tpot_seen), math.sqrt(variance))

    def sample(self, pool: str, cls: str, load: int, tokens: float, rng: random.Random) -> float:
        """A Thompson draw of E2E: normal around the prediction with its standard error."""
        predicted = self.predict(pool, cls, load, tokens)
        return max(0.0, rng.gauss(predicted.e2e_s, predicted.stddev_e2e))

    def snapshot(self) -> dict[str, Any]:
        """The priors, every pool's curve and every pair's tables, JSON-able, for explain and admin."""
        now = self._clock()

        def tables(pair: _Pair) -> dict[str, Any]:
            keep = math.exp(self._decay_rate * (now - pair.fitted_at))
            return {"updated_s_ago": round(now - pair.updated, 3), "ttft": pair.ttft.to_json(keep),
                    "tpot": pair.tpot.to_json(keep)}

        pools = [{"pool": pool, **tables(self._current_pool(pool, force=True))} for pool in self._pools]
        pairs = [{"pool": pool, "class": cls, **tables(self._current(pool, cls, force=True))}
                 for pool, cls in list(self._pairs)]
        return {"half_life_s": self.half_life_s, "max_pairs": self.max_pairs, "pool_lends": self.pool_lends,
                "prior_scale": {"ttft": self._scale[0], "tpot": self._scale[1]},
                "buckets": [bucket_label(b, self._last) for b in range(self._buckets)],
                "speculative_pools": sorted(self.speculative_pools), "priors": asdict(self.priors),
                "pools": pools, "pairs": pairs}

    def _current_pool(self, pool: str, force: bool = False) -> _Pair:
        """The pool's curve, refitted if it heard something new (at most every `refit_s`)."""
        curve = self._pools.get(pool)
        if curve is None:  # its priors, scaled by what the others measured lately
            for other in self._pools:
                self._current_pool(other, force)
            return self._cold[pool in self.speculative_pools]
        if curve.fitted_at < curve.updated and (force or self._clock() - curve.fitted_at >= self.refit_s):
            self._fit_pool(curve, pool in self.speculative_pools)
            self._rescale()
        return curve

    def _current(self, pool: str, cls: str, force: bool = False) -> _Pair:
        """The class's tables, refitted if it or its pool's curve changed (at most every `refit_s`)."""
        curve = self._current_pool(pool, force)
        pair = self._pairs.get((pool, cls))
        if pair is None:
            pair = self._unseen.get(pool)
            if pair is None:
                pair = self._unseen[pool] = _Pair(self._buckets)
            stale = pair.pool_fitted_at < curve.fitted_at or not pair.ttft.fit_mean
        else:
            stale = pair.fitted_at < pair.updated or pair.pool_fitted_at < curve.fitted_at
            stale = stale and (force or self._clock() - pair.fitted_at >= self.refit_s or not pair.ttft.fit_mean)
        if stale:
            self._fit_class(pair, curve)
        return pair

    def _rescale(self) -> None:
        """How much slower or faster than the priors the pools that answered are,
        applied to the priors of a pool that has not: the hardware is shared, so
        CPU backends measured 10x slower than the GPU priors make an unmeasured
        pool's prior 10x slower too, instead of a lure every request takes."""
        scale = []
        for metric in (0, 1):
            measured = expected = 0.0
            for pool, curve in self._pools.items():
                series = curve.series()[metric]
                if not series.fit_weight:
                    continue  # not fitted yet
                prior = self._prior_tables[pool in self.speculative_pools][metric]
                measured += sum(w * m for w, m in zip(series.fit_weight, series.mean, strict=True))
                expected += sum(w * p for w, p in zip(series.fit_weight, prior, strict=True))
            scale.append(measured / expected if expected > 0 and measured > 0 else 1.0)
        if any(abs(new / old - 1) > 0.02 for new, old in zip(scale, self._scale, strict=True)):
            self._scale = scale
            for speculative, cold in self._cold.items():
                cold.updated = self._clock()  # classes anchored on it refit
                self._fit_pool(cold, speculative)

    def _fit_pool(self, curve: _Pair, speculative: bool) -> _Pair:
        w0, spread2 = self.priors.weight, self.priors.relative_stddev ** 2
        for series, table, scale in zip(curve.series(), self._prior_tables[speculative], self._scale, strict=True):
            prior = [scale * value for value in table]
            _, weights = series.forgotten(curve.updated, self._decay_rate)
            anchors = _anchors(series.mean, weights, prior, w0)
            series.fit(anchors, [spread2 * a * a for a in anchors], [0.0] * len(anchors), w0, curve.updated,
                       self._decay_rate)
        curve.fitted_at = curve.updated
        return curve

    def _fit_class(self, pair: _Pair, curve: _Pair) -> None:
        at = max(pair.updated, curve.fitted_at)
        pool_keep = math.exp(self._decay_rate * (at - curve.fitted_at))
        w0 = self.priors.weight
        for own, pooled in zip(pair.series(), curve.series(), strict=True):
            own.fit(*_class_anchor(own, pooled, pool_keep, at, self._decay_rate, w0, self.pool_lends), w0, at,
                    self._decay_rate)
        pair.fitted_at, pair.pool_fitted_at = at, curve.fitted_at
