"""Predicted latency per (pool, traffic class) as a function of the pool's load.

    predicted E2E = TTFT(load) + expected output tokens x TPOT(load + 1)

`load` is the pool's load when the request was dispatched (the gateway's
in-flight count, or the backends' running + waiting). TTFT is kept by that
load; TPOT by the batch the request decoded in, itself included (load + 1), so
a prediction reads both where they were written.

Per (pool, class) there is a fixed table of load buckets (0, 1, 2-3, 4-7, ...,
the last one open), each holding an exponentially forgetting mean and variance
of TTFT and of TPOT. Forgetting is by time, not by samples: a sample's weight
halves every `half_life_s`. The model then follows a pool whose draft degrades
in a fixed time whatever the request rate (three half-lives of 10 s leave 12.5%
of the weight on what came before), where a per-sample factor would follow in
seconds on a busy class and in minutes on a quiet one. A bucket's weight (its
forgotten sample count) also shrinks while it sees nothing, so a stale estimate
grows uncertain, though only toward the spread its answers had, not the
prior's: `route: fastest` adds a floor of exploration (fastest.py) to try a
stale pool again.

A bucket's estimate is its own mean shrunk toward an anchor worth
`LatencyPriors.weight` samples: the prior curve scaled by how the nearest other
buckets holding at least that much weight compare with it (interpolated between
the one below and the one above), the bucket's own mean when no other has data,
or the prior itself while the pair has none. An empty bucket is its anchor; a
stale one (its weight forgotten) slides toward what its neighbours see now and
stops lending its old level to them. The fitted table is then made
non-decreasing in load (weighted pool-adjacent-violators): a pool is not
faster under more load. Fitting is O(buckets) (~45 us for a pair) and
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


@dataclass(frozen=True, slots=True)
class LatencyPriors:
    """Cold-start curves, used before a (pool, class) has answered anything.

    The defaults are the pool simulator's GPU model (docs/sim.md: an 8B target
    on one A100, an EAGLE-style draft of 3 tokens; step time W + p*C + b*(K + C)
    with W = 10 ms, C = 0.25 ms, K = 0.05 ms) and the speed-ups measured in
    docs/benchmarks.md. CPU backends are several times slower per token
    (`specgate tune`: ~58 ms), so a deployment there sets its own; the learned
    estimates replace the priors within a few samples either way.
    """
    # First token with nothing else running: W plus a 200-token prefill at C per token.
    ttft_s: float = 0.06
    # The admitting step grows by K + C per running sequence.
    ttft_per_seq_s: float = 0.0003
    # Standard pool, one sequence: the simulated step at b = 1 (10.3 ms) ...
    standard_tpot_s: float = 0.0103
    # ... growing by K + C per sequence (86.8 ms at b = 256).
    standard_tpot_per_seq_s: float = 0.0003
    # Speculative TPOT at one sequence = standard / this. Simulator at b = 1:
    # 1.43-2.54x (2.18x chat at T=0); bundled engine: 1.65-3.48x; vLLM: up to 2.8x.
    speculative_speedup: float = 2.0
    # Where speculative TPOT reaches standard's (linear in between and beyond):
    # simulator, chat at T=0, b = 64 (1.00x); the routing replay did best with busy at 64.
    crossover_load: int = 64
    # How far off a prior may be, as a fraction of it (the spread of cold Thompson draws).
    relative_stddev: float = 0.5
    # How many samples an anchor (prior, or neighbours' data) counts for against a bucket's own.
    weight: float = 1.0

    def __post_init__(self) -> None:
        times = (self.ttft_s, self.standard_tpot_s, self.speculative_speedup, self.weight)
        if min(times) <= 0 or min(self.ttft_per_seq_s, self.standard_tpot_per_seq_s, self.relative_stddev) < 0 \
                or self.crossover_load < 1:
            raise ValueError("priors: times, speed-up and weight must be positive, the rest not negative, "
                             "crossover_load at least 1")

    def ttft(self, load: float) -> float:
        return self.ttft_s + load * self.ttft_per_seq_s

    def tpot(self, batch: float, speculative: bool) -> float:
        batch = max(batch, 1.0)
        standard = self.standard_tpot_s + (batch - 1) * self.standard_tpot_per_seq_s
        if not speculative:
            return standard
        alone = self.standard_tpot_s / self.speculative_speedup
        at_crossover = self.standard_tpot_s + (self.crossover_load - 1) * self.standard_tpot_per_seq_s
        return alone + (batch - 1) * (at_crossover - alone) / max(self.crossover_load - 1, 1)


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
    __slots__ = ("weight", "mean", "squares", "at", "fit_mean", "fit_var", "fit_weight")

    def __init__(self, buckets: int) -> None:
        self.weight = [0.0] * buckets
        self.mean = [0.0] * buckets
        self.squares = [0.0] * buckets
        self.at = [0.0] * buckets
        self.fit_mean: list[float] = []
        self.fit_var: list[float] = []
        self.fit_weight: list[float] = []

    def add(self, b: int, value: float, now: float, decay_rate: float) -> None:
        """West's weighted update after forgetting since the bucket's last sample."""
        keep = math.exp(decay_rate * (now - self.at[b])) if self.weight[b] > 0 else 0.0
        weight = self.weight[b] * keep + 1.0
        delta = value - self.mean[b]
        mean = self.mean[b] + delta / weight
        self.squares[b] = self.squares[b] * keep + delta * (value - mean)
        self.weight[b], self.mean[b], self.at[b] = weight, mean, now

    def fit(self, prior: list[float], now: float, decay_rate: float, priors: LatencyPriors) -> None:
        w0, spread2 = priors.weight, priors.relative_stddev ** 2
        exp = math.exp
        keeps = [exp(decay_rate * (now - at)) if weight > 0 else 0.0 for weight, at in zip(self.weight, self.at,
                                                                                           strict=True)]
        weights = [weight * keep for weight, keep in zip(self.weight, keeps, strict=True)]
        means, variances = [], []
        for weight, mean, squares, keep, anchor in zip(weights, self.mean, self.squares, keeps,
                                                       _anchors(self.mean, weights, prior, w0), strict=True):
            total = weight + w0
            means.append((weight * mean + w0 * anchor) / total)
            variances.append((squares * keep + w0 * spread2 * anchor * anchor) / total)
        _isotonic(means, [w + w0 for w in weights])
        self.fit_mean, self.fit_var, self.fit_weight = means, variances, weights

    def to_json(self, keep: float, w0: float) -> dict[str, list[Any]]:
        return {"samples": [round(w * keep, 3) for w in self.fit_weight],
                "observed_s": [m if w > 0 else None for m, w in zip(self.mean, self.weight, strict=True)],
                "fitted_s": self.fit_mean,
                "stderr_s": [math.sqrt(v / (w * keep + w0)) for v, w in zip(self.fit_var, self.fit_weight,
                                                                             strict=True)]}


class _Pair:
    __slots__ = ("ttft", "tpot", "updated", "fitted_at")

    def __init__(self, buckets: int) -> None:
        self.ttft = _Series(buckets)
        self.tpot = _Series(buckets)
        self.updated = 0.0  # last observation
        self.fitted_at = -math.inf  # the last observation the fitted tables include


class LatencyModel:
    """TTFT and TPOT by load bucket per (pool, traffic class), learned online."""

    def __init__(self, speculative_pools: Iterable[str] = (), priors: LatencyPriors | None = None,
                 half_life_s: float = 10.0, buckets: int = 12, max_pairs: int = 512, refit_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if half_life_s <= 0 or buckets < 2 or max_pairs < 1 or refit_s < 0:
            raise ValueError("half_life_s > 0, buckets >= 2, max_pairs >= 1 and refit_s >= 0 are required")
        self.priors = priors or LatencyPriors()
        self.half_life_s = half_life_s
        self.max_pairs = max_pairs
        self.refit_s = refit_s
        self.speculative_pools = frozenset(speculative_pools)
        self._last = buckets - 1
        self._decay_rate = -math.log(2) / half_life_s
        self._clock = clock
        self._pairs: OrderedDict[tuple[str, str], _Pair] = OrderedDict()
        loads = [_bucket_load(b) for b in range(buckets)]
        self._prior_tables = {
            speculative: ([self.priors.ttft(load) for load in loads],
                          [self.priors.tpot(load, speculative) for load in loads])
            for speculative in (False, True)}
        self._cold = {speculative: self._fitted(_Pair(buckets), speculative) for speculative in (False, True)}

    def __len__(self) -> int:
        return len(self._pairs)

    def observe(self, pool: str, cls: str, load: int, ttft_s: float | None, tpot_s: float | None) -> None:
        """One answered request; a missing, negative or non-finite measure is left out."""
        key = (pool, cls)
        pair = self._pairs.get(key)
        if pair is None:
            pair = self._pairs[key] = _Pair(self._last + 1)
            if len(self._pairs) > self.max_pairs:
                self._pairs.popitem(last=False)
        else:
            self._pairs.move_to_end(key)
        now = self._clock()
        if ttft_s is not None and 0.0 <= ttft_s < math.inf:
            pair.ttft.add(load_bucket(load, self._last), ttft_s, now, self._decay_rate)
        if tpot_s is not None and 0.0 <= tpot_s < math.inf:
            pair.tpot.add(load_bucket(load + 1, self._last), tpot_s, now, self._decay_rate)
        pair.updated = now

    def predict(self, pool: str, cls: str, load: int, expected_tokens: float) -> Prediction:
        pair = self._pairs.get((pool, cls))
        if pair is None:
            pair, keep = self._cold[pool in self.speculative_pools], 1.0
        else:
            now = self._clock()
            if pair.fitted_at < pair.updated and now - pair.fitted_at >= self.refit_s:
                self._fitted(pair, pool in self.speculative_pools)
            keep = math.exp(self._decay_rate * (now - pair.fitted_at))
        first, per_token = pair.ttft, pair.tpot
        b_first, b_token = load_bucket(load, self._last), load_bucket(load + 1, self._last)
        w_first, w_token = first.fit_weight[b_first] * keep, per_token.fit_weight[b_token] * keep
        w0 = self.priors.weight
        ttft, tpot = first.fit_mean[b_first], per_token.fit_mean[b_token]
        variance = (first.fit_var[b_first] / (w_first + w0)
                    + expected_tokens * expected_tokens * per_token.fit_var[b_token] / (w_token + w0))
        return Prediction(ttft, tpot, ttft + expected_tokens * tpot, min(w_first, w_token), math.sqrt(variance))

    def sample(self, pool: str, cls: str, load: int, tokens: float, rng: random.Random) -> float:
        """A Thompson draw of E2E: normal around the prediction with its standard error."""
        predicted = self.predict(pool, cls, load, tokens)
        return max(0.0, rng.gauss(predicted.e2e_s, predicted.stddev_e2e))

    def snapshot(self) -> dict[str, Any]:
        """The priors and every pair's tables, JSON-able, for explain and admin."""
        now, w0 = self._clock(), self.priors.weight
        pairs = []
        for (pool, cls), pair in self._pairs.items():
            if pair.fitted_at < pair.updated:
                self._fitted(pair, pool in self.speculative_pools)
            keep = math.exp(self._decay_rate * (now - pair.fitted_at))
            pairs.append({"pool": pool, "class": cls, "updated_s_ago": round(now - pair.updated, 3),
                          "ttft": pair.ttft.to_json(keep, w0), "tpot": pair.tpot.to_json(keep, w0)})
        return {"half_life_s": self.half_life_s, "max_pairs": self.max_pairs,
                "buckets": [bucket_label(b, self._last) for b in range(self._last + 1)],
                "speculative_pools": sorted(self.speculative_pools), "priors": asdict(self.priors),
                "pairs": pairs}

    def _fitted(self, pair: _Pair, speculative: bool) -> _Pair:
        ttft_prior, tpot_prior = self._prior_tables[speculative]
        pair.ttft.fit(ttft_prior, pair.updated, self._decay_rate, self.priors)
        pair.tpot.fit(tpot_prior, pair.updated, self._decay_rate, self.priors)
        pair.fitted_at = pair.updated
        return pair
