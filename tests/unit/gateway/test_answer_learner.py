"""What each answer teaches (gateway/edge/learning.py): a stream its times and acceptance, a
whole body only the acceptance its backend reported, an undefined domain nothing; with shared
state, every stream's times go to the other replicas too."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.decide.routing import cold_model
from gateway.edge.learning import AnswerLearner
from gateway.metrics import Children, GatewayMetrics
from gateway.policy.loader import parse_policy
from gateway.state.shared_learning import Observation
from gateway.upstream.drafting import Drafting
from gateway.upstream.meter import Measurement
from gateway.upstream.runtime import Runtime

POLICY = """
version: 1
pools:
  speculative: {kind: speculative, endpoints: [{url: "http://127.0.0.1:9"}], fallback: standard}
  standard: {kind: standard, endpoints: [{url: "http://127.0.0.1:10"}]}
rules: [{name: all, route: fastest}]
"""
CLS = "code/greedy"


class Recorded:
    """Stands in for SharedLearning: what would go to the other replicas."""

    def __init__(self) -> None:
        self.observations: list[Observation] = []

    def record(self, observation: Observation) -> None:
        self.observations.append(observation)


def learner(shared: Any = None) -> AnswerLearner:
    policy = parse_policy(POLICY)
    return AnswerLearner(cold_model(policy), Runtime(policy), Children(GatewayMetrics().acceptance), shared)


def samples(learned: AnswerLearner, pool: str, measure: str) -> int:
    pairs = [p for p in learned.latency.snapshot()["pairs"] if (p["pool"], p["class"]) == (pool, CLS)]
    return sum(sum(p[measure]["samples"]) for p in pairs)


def test_a_stream_teaches_its_times_its_acceptance_and_the_gauge():
    shared = Recorded()
    learned = learner(shared)
    learned.observe(Measurement("speculative", CLS, 2, 1.0, 40, True, ttft_s=0.2, tpot_s=0.02,
                                drafting=Drafting(3.0, 3), batch=2.0))
    assert samples(learned, "speculative", "ttft") == 1 and samples(learned, "speculative", "tpot") == 1
    rate = learned.latency.acceptance.rate("speculative", CLS)
    assert learned.acceptance("speculative", CLS).value == pytest.approx(rate)
    assert shared.observations == [Observation("speculative", CLS, 2, 0.2, 0.02)]


def test_a_whole_body_teaches_only_the_acceptance_its_backend_reported():
    learned = learner()
    before = learned.latency.acceptance.rate("speculative", CLS)
    learned.observe(Measurement("speculative", CLS, 0, 1.0, 40, False, drafting=Drafting(1.2, 4)))
    assert samples(learned, "speculative", "ttft") == 0 and samples(learned, "speculative", "tpot") == 0
    assert learned.latency.acceptance.rate("speculative", CLS) < before  # 1.2 tokens a step of 4 drafts: low
    learned.observe(Measurement("speculative", CLS, 0, 1.0, 40, False, drafting=Drafting(1.2)))  # drafts unknown
    learned.observe(Measurement("speculative", CLS, 0, 1.0, 40, False))
    assert samples(learned, "speculative", "ttft") == 0


def test_an_answer_of_an_undefined_domain_teaches_nothing():
    shared = Recorded()
    learned = learner(shared)
    learned.observe(Measurement("standard", None, 0, 1.0, 40, True, ttft_s=0.2, tpot_s=0.02))
    assert learned.latency.snapshot()["pairs"] == [] and shared.observations == []
