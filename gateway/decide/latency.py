"""Predicted latency per (pool, traffic class) as a function of the pool's load.

    predicted E2E = TTFT(load) + expected output tokens x TPOT(load + 1)

`load` is the pool's load when the request was dispatched (the gateway's
in-flight count, or the backends' running + waiting). TTFT is kept by that
load; TPOT by the batch the request decoded in: the pool's mean in flight
while its lease was held, itself included (`load + 1` where that is unknown),
so a prediction reads TPOT at `load + 1`, a batch that one more request makes.

What the tables keep of decoding is the *step time*: the time per output token
times the tokens a step yielded (the answer's measured tokens per step, else
what the class's acceptance predicts). A step's time is the pool's physics at
a batch size whatever the classes in it; a class's TPOT is the step time over
the tokens per step its acceptance gives where the pool drafts
(`acceptance.py`, learned per pool and class from each answer). So a standard
pool's step time is its TPOT, and on a speculative pool hot sampling is
predicted slower than greedy code from the priors on, before either answered.
Each pool drafts by its kind's schedule (gateway/policy/kinds.py): a dynamic
pool follows the drafting curve up to its switch and the plain one above it.

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
Fitting is O(buckets) (~50-100 us for a pool and a class) and happens on the first
prediction after an observation, at most once per `refit_s` of a pair's data (a burst
shares one refit; 0.1 s is nothing against a 10 s half-life); `observe` is O(1) and a
prediction is a table lookup. Memory is bounded: `buckets` per pair and `max_pairs`
pairs, the least recently updated dropped first.

Called from the event loop only: nothing here awaits, so no locks.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from gateway.decide.acceptance import Acceptance, tokens_per_step
from gateway.decide.latency_priors import LatencyPriors
from gateway.decide.latency_tables import (
    Pair,
    anchors,
    between,
    bucket_label,
    bucket_load,
    class_anchor,
    highest_fitting_in_stretches,
)
from gateway.decide.prediction import Prediction
from gateway.policy.kinds import Schedule

__all__ = ["LatencyModel", "LatencyPriors", "Prediction", "bucket_label"]

ANSWER_WEIGHT = 1 / 32  # a pool's mean answer length and gateway wait move by this share of each new one
# How far measured hardware may be from the priors: beyond it the ratio is a broken clock or
# backend (a TTFT of 1e-311 s made the priors subnormal and every prediction above them inf)
SCALE_BOUNDS = (1e-6, 1e6)
NO_DRAFTS = Schedule()


class LatencyModel:
    """TTFT and TPOT by load bucket per pool, and per (pool, traffic class) in
    the pool's shape, learned online."""

    def __init__(self, schedules: Mapping[str, Schedule] | None = None, priors: LatencyPriors | None = None,
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
        self.schedules: dict[str, Schedule] = dict(schedules or {})
        self.acceptance = Acceptance(self.priors.spec, half_life_s, max_pairs, clock)
        self._buckets = buckets
        self._last = buckets - 1
        self._loads = [bucket_load(b) for b in range(buckets)]  # the load each bucket stands for in the priors
        self._decay_rate = -math.log(2) / half_life_s
        self._clock = clock
        self._pairs: OrderedDict[tuple[str, str], Pair] = OrderedDict()
        self._pools: dict[str, Pair] = {}  # every answer of the pool, whatever its class
        self._unseen: dict[str, Pair] = {}  # per pool, a class with no answers yet, anchored on its curve
        self._prior_tables: tuple[list[float], list[float]] | None = None
        self._scale = [1.0, 1.0]  # measured over prior, TTFT and step time, across the pools that answered
        # A schedule's cold curve, keyed by its ranges: a tuple's hash is C's, a Schedule's a Python call
        # (a pool no answer timed, every non-streamed one's, is read twice a candidate per request)
        self._cold: dict[tuple[tuple[int, int, int], ...], tuple[Schedule, Pair]] = {}
        self._step_costs: dict[tuple[float, int], float] = {}  # (batch, drafts) -> a drafting step over a plain one
        self._costs: dict[str, list[tuple[float, int]]] = {}  # per pool, that and drafts at each bucket's load + 1
        self._answers: dict[str, float] = {}  # per pool, the mean output tokens of its answers, forgetting
        self._waits: dict[str, float] = {}  # per pool, the mean time its requests waited at the gateway
        self._rooms: dict[tuple[str, str], int] = {}  # per (pool, class), the last room `room` found past the load

    def __len__(self) -> int:
        return len(self._pairs)

    def schedule(self, pool: str) -> Schedule:
        """How `pool` drafts by batch size; a pool the policy did not describe drafts nothing."""
        return self.schedules.get(pool) or NO_DRAFTS

    def tokens_per_step(self, pool: str, cls: str, batch: int) -> float:
        """What a step of `pool` yields the class at `batch` sequences: 1 where it does not draft."""
        drafts = self.schedule(pool).drafts(max(batch, 1))
        return tokens_per_step(self.acceptance.rate(pool, cls), drafts) if drafts else 1.0

    def _per_plain_step(self, schedule: Schedule, rate: float, batch: float) -> float:
        """A class's TPOT at `batch` on a pool that drafts by `schedule`, its draft accepted at
        `rate`, per unit of plain-equivalent step time: the drafting step's cost over a plain
        one's, by the priors, over the tokens it yields."""
        drafts = schedule.drafts(max(round(batch), 1)) if schedule.ever_drafts else 0
        return self._step_cost(batch, drafts) / tokens_per_step(rate, drafts) if drafts else 1.0

    def _step_cost(self, batch: float, drafts: int) -> float:
        """A drafting step's time over a plain one's at `batch`, by the priors: a pure function of them, kept."""
        cost = self._step_costs.get((batch, drafts))
        if cost is None:
            cost = self.priors.step(batch, drafts) / self.priors.step(batch, 0)
            if len(self._step_costs) < 4096:  # bounded: batches are integers below the load's cap
                self._step_costs[batch, drafts] = cost
        return cost

    def observe(self, pool: str, cls: str, load: int, ttft_s: float | None, tpot_s: float | None,
                per_step: float | None = None, drafts: int | None = None, batch: float | None = None) -> None:
        """One answered request; a missing, negative or non-finite measure is left out.
        `per_step`: the tokens its steps yielded (measured), with `drafts` drafted a step
        (else the pool's schedule at its batch); it teaches the class's acceptance and
        turns the time per token into the pool's step time. `batch`: the pool's mean in
        flight while it ran, itself included, where its TPOT is kept (else at `load + 1`;
        docs/routing.md says why)."""
        batch = load + 1 if batch is None or not 1.0 <= batch < math.inf else max(1, round(batch))
        drafts = self.schedule(pool).drafts(batch) if drafts is None else drafts
        if per_step is not None and drafts > 0:
            self.acceptance.observe(pool, cls, per_step, drafts)
        if tpot_s is not None and drafts:  # to a plain step's time: what the tables keep
            cost = self._step_cost(batch, drafts)
            tokens = per_step if per_step is not None and per_step >= 1 else self.tokens_per_step(pool, cls, batch)
            tpot_s *= tokens / cost
        key = (pool, cls)
        pair = self._pairs.get(key)
        if pair is None:
            pair = self._pairs[key] = Pair(self._buckets)
            if len(self._pairs) > self.max_pairs:
                self._pairs.popitem(last=False)
        else:
            self._pairs.move_to_end(key)
        curve = self._pools.get(pool)
        if curve is None:
            curve = self._pools[pool] = Pair(self._buckets)
        now = self._clock()
        for target in (pair, curve):
            if ttft_s is not None and 0.0 <= ttft_s < math.inf:
                target.ttft.add(load, ttft_s, now, self._decay_rate)
            if tpot_s is not None and 0.0 <= tpot_s < math.inf:
                target.tpot.add(batch, tpot_s, now, self._decay_rate)
            target.updated = now

    def predict(self, pool: str, cls: str, load: int, expected_tokens: float) -> Prediction:
        return self.estimate(pool, cls, load, expected_tokens)[0]

    def estimate(self, pool: str, cls: str, load: int, expected_tokens: float) -> tuple[Prediction, float]:
        """`predict`, and how much one more sequence slows each token of `pool`'s batch at `load`
        (the class's curve's slope to the next bucket): both, per candidate per request, in one piece."""
        pair = self._current(pool, cls)
        at = pair.fitted_at
        keep = math.exp(self._decay_rate * (self._clock() - at)) if at > -math.inf else 1.0
        last = self._last
        first = load.bit_length() if load > 0 else 0  # load_bucket(load), load_bucket(load + 1), inline
        ttft, ttft_var, ttft_seen = pair.ttft.read(first if first < last else last, keep)
        here = (load + 1).bit_length() if load >= 0 else 0
        here = here if here < last else last
        step, step_var, tpot_seen = pair.tpot.read(here, keep)
        there = here + 1  # the slope: from this bucket to the next (the last: from the one before)
        if there > last:
            here, there = here - 1, here
        table = pair.tpot.fit_mean
        low, high = self._loads[here], self._loads[there]
        schedule = self.schedules.get(pool) or NO_DRAFTS
        if schedule.ever_drafts:
            rate = self.acceptance.rate(pool, cls)
            costs = self._bucket_costs(pool, schedule)
            factor = self._per_plain_step(schedule, rate, load + 1)
            (cost_high, drafts_high), (cost_low, drafts_low) = costs[there], costs[here]
            yields = tokens_per_step(rate, drafts_high)  # the same at both ends, but where the schedule switches
            rise = (table[there] * cost_high / yields - table[here] * cost_low
                    / (yields if drafts_low == drafts_high else tokens_per_step(rate, drafts_low)))
            step, step_var = step * factor, step_var * factor * factor
        else:
            rise = table[there] - table[here]
        e2e = ttft + expected_tokens * step
        predicted = Prediction(ttft, step, e2e, ttft_seen if ttft_seen < tpot_seen else tpot_seen,
                               math.sqrt(ttft_var + expected_tokens * expected_tokens * step_var))
        return predicted, max(0.0, rise / (high - low))

    def _bucket_costs(self, pool: str, schedule: Schedule) -> list[tuple[float, int]]:
        """Per load bucket, at one more than its load: a step of `pool` over a plain one's (1
        where it does not draft) and its drafts; a pure function of the priors, kept."""
        costs = self._costs.get(pool)
        if costs is None:
            costs = self._costs[pool] = []
            for load in self._loads:
                batch = load + 1
                drafts = schedule.drafts(max(round(batch), 1))
                costs.append((self.priors.step(batch, drafts) / self.priors.step(batch, 0) if drafts else 1.0,
                              drafts))
        return costs

    def answered(self, pool: str, tokens: int) -> None:
        """An answer of `tokens` output tokens from `pool`, streamed or not: its mean answer."""
        if tokens > 0:
            _follow(self._answers, pool, tokens)

    def answer_tokens(self, pool: str, default: float) -> float:
        """The mean output tokens of `pool`'s recent answers; `default` before it has any."""
        return self._answers.get(pool, default)

    def admitted(self, pool: str, waited_s: float) -> None:
        """A request sent to `pool` after waiting `waited_s` at the gateway (0 if it was not held)."""
        if 0.0 <= waited_s < math.inf:
            _follow(self._waits, pool, waited_s)

    def gateway_wait(self, pool: str) -> float:
        """The mean time `pool`'s recent requests waited at the gateway before going in."""
        return self._waits.get(pool, 0.0)

    def room(self, pool: str, cls: str, ttft_s: float | None, tpot_s: float | None, tokens: float,
             below: int, waited_s: float = 0.0) -> int | None:
        """The highest load under `below` at which one more request of `tokens` output tokens,
        having waited `waited_s`, meets the objective: its wait and E2E within `ttft_s + tokens
        x tpot_s` (no `ttft_s`: none; no `tpot_s`: its wait and TTFT within `ttft_s`); None where
        no load does. Read on the pool's curve, not the class's tables (one more sequence slows
        every class on the replica; the class counts through what its drafts yield), between
        the buckets, each standing for the mean load of its answers: the room moves by one
        request, not by a bucket of 32. Found from the last room, a stretch of one drafting count at a time."""
        pair, schedule = self._current_pool(pool), self.schedules.get(pool) or NO_DRAFTS  # `schedule`, inline
        rate = self.acceptance.rate(pool, cls) if schedule.ever_drafts else None  # None: it never drafts
        ttfts, ttft_loads = pair.ttft.fit_mean, pair.ttft.centre
        tpots, tpot_loads = pair.tpot.fit_mean, pair.tpot.centre
        allowed = None if tpot_s is None else (ttft_s or 0.0) + tokens * tpot_s
        def fits(load: int) -> bool:
            ttft = waited_s + between(ttfts, load, ttft_loads)
            if allowed is None:
                return ttft_s is None or ttft <= ttft_s
            tpot = between(tpots, load + 1, tpot_loads)
            drafts = 1.0 if rate is None else self._per_plain_step(schedule, rate, load + 1)
            return ttft + tokens * tpot * drafts <= allowed

        found = highest_fitting_in_stretches(fits, below, self._rooms.get((pool, cls), 0),
                                             schedule.stretches if rate is not None else ())
        if found is not None and found < below - 1 and len(self._rooms) < 4096:
            self._rooms[pool, cls] = found  # past the load: where the next search starts
        return found

    def snapshot(self) -> dict[str, Any]:
        """The priors, every pool's curve and every pair's tables, JSON-able, for explain and admin."""
        now = self._clock()

        def tables(pair: Pair) -> dict[str, Any]:
            keep = math.exp(self._decay_rate * (now - pair.fitted_at))
            return {"updated_s_ago": round(now - pair.updated, 3), "ttft": pair.ttft.to_json(keep),
                    "tpot": pair.tpot.to_json(keep)}

        pools = [{"pool": pool, **tables(self._current_pool(pool, force=True))} for pool in self._pools]
        pairs = [{"pool": pool, "class": cls, **tables(self._current(pool, cls, force=True))}
                 for pool, cls in list(self._pairs)]
        return {"half_life_s": self.half_life_s, "max_pairs": self.max_pairs, "pool_lends": self.pool_lends,
                "prior_scale": {"ttft": self._scale[0], "tpot": self._scale[1]},
                "buckets": [bucket_label(b, self._last) for b in range(self._buckets)],
                "schedules": {pool: s.to_json() for pool, s in self.schedules.items()},
                "priors": self.priors.spec.model_dump(), "acceptance": self.acceptance.snapshot(),
                "pools": pools, "pairs": pairs}

    def _current_pool(self, pool: str, force: bool = False) -> Pair:
        """The pool's curve, refitted if it heard something new (at most every `refit_s`)."""
        curve = self._pools.get(pool)
        if curve is None:  # its priors, scaled by what the others measured lately
            for other in self._pools:
                self._current_pool(other, force)
            return self._cold_curve(self.schedule(pool))
        if curve.fitted_at < curve.updated and (force or self._clock() - curve.fitted_at >= self.refit_s):
            self._fit_pool(curve, self.schedule(pool))
            self._rescale()
        return curve

    def _current(self, pool: str, cls: str, force: bool = False) -> Pair:
        """The class's tables, refitted if it or its pool's curve changed (at most every `refit_s`)."""
        curve = self._current_pool(pool, force)
        pair = self._pairs.get((pool, cls))
        if pair is None:
            pair = self._unseen.get(pool)
            if pair is None:
                pair = self._unseen[pool] = Pair(self._buckets)
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
                prior = self._priors_of(self.schedule(pool))[metric]
                measured += sum(w * m for w, m in zip(series.fit_weight, series.mean, strict=True))
                expected += sum(w * p for w, p in zip(series.fit_weight, prior, strict=True))
            ratio = measured / expected if expected > 0 and measured > 0 else 1.0
            scale.append(min(max(ratio, SCALE_BOUNDS[0]), SCALE_BOUNDS[1]))
        if any(abs(new / old - 1) > 0.02 for new, old in zip(scale, self._scale, strict=True)):
            self._scale = scale
            for schedule, cold in self._cold.values():
                cold.updated = self._clock()  # classes anchored on it refit
                self._fit_pool(cold, schedule)

    def _priors_of(self, schedule: Schedule) -> tuple[list[float], list[float]]:
        """The prior TTFT and plain-step tables by load bucket (the same for every schedule:
        the tables keep plain-equivalent step times, `_per_plain_step` turns them into TPOT)."""
        tables = self._prior_tables
        if tables is None:
            tables = self._prior_tables = ([self.priors.ttft(load) for load in self._loads],
                                           [self.priors.step(load, 0) for load in self._loads])
        return tables

    def _cold_curve(self, schedule: Schedule) -> Pair:
        cold = self._cold.get(schedule.ranges)
        if cold is None:
            cold = self._cold[schedule.ranges] = (schedule, self._fit_pool(Pair(self._buckets), schedule))
        return cold[1]

    def _fit_pool(self, curve: Pair, schedule: Schedule) -> Pair:
        w0, spread2 = self.priors.weight, self.priors.relative_stddev ** 2
        for series, table, scale in zip(curve.series(), self._priors_of(schedule), self._scale, strict=True):
            prior = [scale * value for value in table]
            _, weights = series.forgotten(curve.updated, self._decay_rate)
            anchored = anchors(series.mean, weights, prior, w0)
            series.fit(anchored, [spread2 * a * a for a in anchored], [0.0] * len(anchored), w0, curve.updated,
                       self._decay_rate)
        curve.fitted_at = curve.updated
        return curve

    def _fit_class(self, pair: Pair, curve: Pair) -> None:
        at = max(pair.updated, curve.fitted_at)
        pool_keep = math.exp(self._decay_rate * (at - curve.fitted_at))
        w0 = self.priors.weight
        for own, pooled in zip(pair.series(), curve.series(), strict=True):
            own.fit(*class_anchor(own, pooled, pool_keep, at, self._decay_rate, w0, self.pool_lends), w0, at,
                    self._decay_rate)
        pair.fitted_at, pair.pool_fitted_at = at, curve.fitted_at


def _follow(means: dict[str, float], pool: str, value: float) -> None:
    """Move `pool`'s running mean in `means` toward `value` by `ANSWER_WEIGHT`; the first value starts it."""
    mean = means.get(pool)
    means[pool] = value if mean is None else mean + ANSWER_WEIGHT * (value - mean)
