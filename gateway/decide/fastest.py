"""`route: fastest`: of a rule's candidate pools, the one that costs the fleet least.

Per candidate the latency model predicts

    E2E = TTFT(load) + expected tokens x TPOT(load + 1)

at the pool's load as the request sees it, for the request's traffic class,
and the cost is that plus the delay the request adds to the ones already
running there:

    cost = E2E + load x (expected tokens / 2) x dTPOT/dload

each running sequence having on average half its tokens still to go, each
slowed by the slope of the pool's curve at its load (LatencyModel.estimate).
Placing by own E2E alone piles requests onto the pool that is fastest for
each of them while it slows everyone there; the cost to the fleet is what the
sum of everyone's latency sees. On an idle pool the added delay is nil, so
light load is placed by E2E alone.
The expected tokens are the request's max_tokens capped by the policy's
`routing.typical_output_tokens`: max_tokens is an upper bound most answers
stop well short of, and a fixed cap keeps the choice a pure function of the
request and the policy (no second learned quantity to go stale).

The choice is a Thompson draw: each candidate's E2E is sampled from its
prediction's uncertainty and the smallest sample wins. A pool that has been
measured much slower than another seldom wins a draw, and less often the
more it is measured. The winner by mean is kept beside it: when the two
differ the choice explored. Without a random generator the mean decides
(explain, tests).

Draws alone would not try a slower pool again: once its measurements are
forgotten its estimate's spread tends to the spread its answers had, not to
the prior's, so a pool measured twice as slow with steady answers never wins
a draw, and would not be seen to recover. So a floor: with probability
`EXPLORE_SHARE` a decision goes to the stalest candidate other than the best
whose estimate rests on less than `STALE_SAMPLES` of remembered answers.
The share is a bound that holds whatever the request rate and however noisy
the answers, and it is spent only on a pool the model has stopped knowing:
one answer makes it known again, so on busy traffic the floor costs about one
request per stale pool and class every half-life or two. Inflating the draw's
spread by the estimate's age was the other way; its share would grow without
bound on quiet traffic (a forgotten pool at the prior's 50% spread that is
twice as slow wins about 16% of draws) and depends on a rate of inflation to
choose.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from gateway.decide.latency import LatencyModel
from gateway.decide.prediction import Prediction
from gateway.policy.classes import traffic_class
from gateway.policy.features import Features

EXPLORE_SHARE = 0.02  # at most this share of decisions goes to a stale candidate that is not the best
STALE_SAMPLES = 1.0  # an estimate resting on less remembered weight than one answer is stale


class Estimate:
    """One candidate as the model sees it for one request. A plain class, as `Prediction` is."""

    def __init__(self, pool: str, load: int, predicted: Prediction, added_s: float, cost_s: float,
                 sample_s: float) -> None:
        self.pool = pool
        self.load = load
        self.predicted = predicted
        self.added_s = added_s  # the delay it adds to the requests already running on the pool
        self.cost_s = cost_s  # predicted E2E plus added_s
        self.sample_s = sample_s  # the Thompson draw of E2E, plus added_s (the mean without a generator)

    def to_json(self) -> dict[str, Any]:
        p = self.predicted
        return {"pool": self.pool, "load": self.load, "ttft_s": p.ttft_s, "tpot_s": p.tpot_s, "e2e_s": p.e2e_s,
                "stddev_e2e_s": p.stddev_e2e, "samples": p.samples, "added_s": self.added_s,
                "cost_s": self.cost_s, "sampled_cost_s": self.sample_s}


class Fastest:
    """How `route: fastest` chose, for one request. A plain class, as `Estimate` is."""

    def __init__(self, pool: str, best: str, estimates: tuple[Estimate, ...], traffic: str, tokens: int,
                 past: Mapping[str, int] = MappingProxyType({})) -> None:
        self.pool = pool  # the winner of the draw
        self.best = best  # the winner by predicted mean cost: the class's preferred pool
        self.estimates = estimates  # by predicted mean cost, cheapest first
        self.traffic = traffic
        self.tokens = tokens
        self.past = past  # past their room (admission.py): pool -> room

    @property
    def explored(self) -> bool:
        return self.pool != self.best

    @property
    def chosen(self) -> Estimate:
        return next(e for e in self.estimates if e.pool == self.pool)

    def within(self, past: Mapping[str, int]) -> Fastest:
        """The same draw with `past` known: where some candidate is within its room, the one of
        those with the smallest draw, so placement does not send a request past a pool's room
        while another has some."""
        inside = [e for e in self.estimates if e.pool not in past]
        pool = self.pool if not inside or self.pool not in past else min(inside, key=lambda e: e.sample_s).pool
        return Fastest(pool, self.best, self.estimates, self.traffic, self.tokens, past)

    def chain(self, fallback: Sequence[str]) -> tuple[str, ...]:
        """The chosen pool, the other candidates by predicted mean, then the chosen
        pool's fallbacks: each pool once."""
        return tuple(dict.fromkeys((self.pool, *[e.pool for e in self.estimates], *fallback)))

    def to_json(self) -> dict[str, Any]:
        return {"traffic_class": self.traffic, "expected_tokens": self.tokens, "preferred": self.best,
                "explored": self.explored, "candidates": [e.to_json() for e in self.estimates],
                "past_room": dict(self.past)}


def model_class(features: Features, domains: Collection[str], default_domain: str) -> str:
    """The class a request is predicted under: an undefined domain (a header's) counts as the default one."""
    return traffic_class(features.domain, features.temperature, domains, default_domain)


def fastest(pools: Sequence[str], features: Features, traffic: str, tokens: int, model: LatencyModel,
            rng: random.Random | None) -> Fastest:
    """The pool of `pools` (at least one) with the smallest draw of its cost to the fleet."""
    estimates = []
    loads = features.load
    for pool in pools:
        load = loads.get(pool, 0)
        predicted, slope = model.estimate(pool, traffic, load, tokens)
        added = load * tokens / 2 * slope
        e2e = predicted.e2e_s
        # the Thompson draw: normal around the prediction, with its standard error
        sample = e2e if rng is None else max(0.0, e2e + predicted.stddev_e2e * normal(rng))
        estimates.append(Estimate(pool, load, predicted, added, e2e + added, sample + added))
    estimates.sort(key=_cost)
    chosen = min(estimates, key=_sample)
    if rng is not None and rng.random() < EXPLORE_SHARE:
        stale = [e for e in estimates[1:] if e.predicted.samples < STALE_SAMPLES]
        if stale:
            chosen = min(stale, key=lambda e: e.predicted.samples)
    return Fastest(chosen.pool, estimates[0].pool, tuple(estimates), traffic, tokens)


def normal(rng: random.Random) -> float:
    """A standard normal draw from two of `rng`'s uniforms (Box-Muller): `random.gauss` does the
    same in Python, which runs interpreted beside the compiled decision."""
    return math.sqrt(-2.0 * math.log(1.0 - rng.random())) * math.cos(math.tau * rng.random())


_cost, _sample = attrgetter("cost_s"), attrgetter("sample_s")
