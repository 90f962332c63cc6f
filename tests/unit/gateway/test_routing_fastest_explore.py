"""`route: fastest` keeps trying a pool it has stopped knowing: a pool measured
slower that has since become faster wins again within a bounded number of
decisions, at any request rate, and the floor that finds it takes a bounded
share of the decisions when the pool is still slow."""

from __future__ import annotations

import random

import pytest

from gateway.decide.fastest import EXPLORE_SHARE
from gateway.decide.latency import LatencyModel
from gateway.decide.routing import decide
from gateway.flags import FlagStore

from .test_routing_fastest import CHAT, FAST, POLICY, SLOW, features

RECOVERED = (0.015, 0.0012)  # (ttft_s, tpot_s): faster than FAST now


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(seed: int, every_s: float, speculative_now: tuple[float, float], decisions: int) -> tuple[int | None, int]:
    """Speculative measured SLOW and standard FAST (50 answers each), then
    `decisions` decisions `every_s` apart, each chosen pool answering with its
    times now (+-2%). The first decision after which speculative is the
    preferred pool (None: never), and how many decisions went to speculative."""
    clock, rng = Clock(), random.Random(seed)
    model = LatencyModel(POLICY.schedules, clock=clock)
    for i in range(50):
        clock.now += 0.1
        jitter = 1 + (i % 5 - 2) * 0.01
        model.observe("speculative", CHAT, 0, SLOW[0] * jitter, SLOW[1] * jitter)
        model.observe("standard", CHAT, 0, FAST[0] * jitter, FAST[1] * jitter)
    flags, now = FlagStore(POLICY.speculative_pools).snapshot(), {"speculative": speculative_now, "standard": FAST}
    recovered, taken = None, 0
    for k in range(decisions):
        clock.now += every_s
        decision = decide(features(), POLICY, flags, 0.5, model, rng)
        ttft, tpot = now[decision.pool]
        jitter = 1 + rng.uniform(-0.02, 0.02)
        model.observe(decision.pool, CHAT, 0, ttft * jitter, tpot * jitter)
        taken += decision.pool == "speculative"
        if recovered is None and decision.fastest is not None and decision.fastest.best == "speculative":
            recovered = k
    return recovered, taken


RECOVERY_CASES = [
    # (id, seconds between decisions, decisions by which the recovered pool is preferred again)
    # Busy: the ten-times-slower measurements take about a minute of half-lives to be forgotten.
    ("busy, 20 decisions a second", 0.05, 1600),
    ("steady, 2 a second", 0.5, 400),
    ("quiet, one every 5 s: forgotten at once, then the floor's 2%", 5.0, 400),
]


@pytest.mark.parametrize("every_s,bound", [c[1:] for c in RECOVERY_CASES], ids=[c[0] for c in RECOVERY_CASES])
@pytest.mark.parametrize("seed", range(5))
def test_a_pool_measured_slower_that_became_faster_is_preferred_again(seed, every_s, bound):
    recovered, _ = replay(seed, every_s, RECOVERED, bound)
    assert recovered is not None, f"still not preferred after {bound} decisions"


STILL_SLOW_CASES = [
    ("busy", 0.05),
    ("steady", 0.5),
    ("quiet", 5.0),
]


@pytest.mark.parametrize("every_s", [c[1] for c in STILL_SLOW_CASES], ids=[c[0] for c in STILL_SLOW_CASES])
def test_a_pool_still_slower_gets_at_most_the_floor_share(every_s):
    decisions = 4000
    recovered, taken = replay(11, every_s, SLOW, decisions)
    assert recovered is None
    assert 0 < taken <= 1.5 * EXPLORE_SHARE * decisions, taken
