"""What the edge tells of a fastest decision: the decision counter by (pool,
rule, explored), the chosen pool's predicted E2E, and one log line when a
class's preferred pool changes."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from gateway.decide.latency import LatencyModel
from gateway.edge.endpoints import ProxyEndpoints
from gateway.flags import FlagStore
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.upstream.runtime import Runtime
from tests.unit.gateway.test_routing_load import POLICY  # two standard pools a and b, route: fastest

BODY = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 64}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def teach(model: LatencyModel, pool: str, tpot: float) -> None:
    for _ in range(50):
        model.observe(pool, "chat/greedy", 0, 0.01, tpot)


def test_decisions_are_counted_and_a_change_of_preferred_pool_is_logged_once():
    clock = Clock()
    model = LatencyModel(clock=clock)
    teach(model, "a", 0.001)
    teach(model, "b", 0.01)
    registry = CollectorRegistry()
    proxy = ProxyEndpoints(Settings(), Runtime(POLICY), FlagStore(()), GatewayMetrics(registry),
                           rng=random.Random(1), latency=model)

    def decide_and_count() -> str:
        decision = proxy.route(BODY, "chat", {}).decision
        proxy._count(decision, "chat")
        return decision.pool

    with capture_logs() as logs:
        first = [decide_and_count() for _ in range(10)]
        clock.now = 100.0  # the old measurements are forgotten; `b` is now the fast one
        teach(model, "a", 0.02)
        teach(model, "b", 0.001)
        second = [decide_and_count() for _ in range(10)]
    assert first.count("a") >= 9 and second.count("b") >= 9
    changes = [entry for entry in logs if entry["event"] == "preferred_pool_changed"]
    assert [(c["before"], c["after"], c["traffic_class"]) for c in changes] == [("a", "b", "chat/greedy")]
    counted = sum(registry.get_sample_value("specgate_route_decisions_total",
                                            {"pool": pool, "rule": "default", "explored": explored, "api": "chat"}) or 0
                  for pool in "ab" for explored in ("true", "false"))
    assert counted == 20
    assert registry.get_sample_value("specgate_predicted_e2e_seconds_count", {"pool": "a"}) == first.count("a") \
        + second.count("a")
