"""The load a routing decision reads (gateway.edge.load_view): the requests
leased since the backends last reported count on top of the report, so a burst
between two reports does not herd onto one pool."""

from __future__ import annotations

import random
from collections import Counter

from gateway.decide.features import extract_features
from gateway.decide.latency import LatencyModel
from gateway.decide.routing import decide
from gateway.edge.load_view import DecisionLoad
from gateway.flags import FlagStore
from gateway.load import LoadReport
from gateway.policy.loader import parse_policy
from gateway.upstream.runtime import Runtime

POLICY = parse_policy("""
version: 1
pools:
  a: {kind: standard, endpoints: [{url: "http://127.0.0.1:1"}]}
  b: {kind: standard, endpoints: [{url: "http://127.0.0.1:2"}]}
rules:
  - {name: default, route: fastest}
""")


def rig() -> tuple[Runtime, DecisionLoad]:
    runtime = Runtime(POLICY, LoadReport())
    return runtime, DecisionLoad(runtime)


def test_without_a_report_the_load_is_the_gateways_own_in_flight_count():
    runtime, load = rig()
    leases = [runtime.pools["a"].acquire() for _ in range(3)]
    assert load() == {"a": 3, "b": 0}
    leases[0].release(True)
    assert load() == {"a": 2, "b": 0}


def test_requests_leased_since_the_report_count_on_top_of_it():
    runtime, load = rig()
    runtime.pools["a"].acquire()
    runtime.reported.publish({"a": 10, "b": 10})  # the backends' count includes the one in flight
    assert load() == {"a": 10, "b": 10}
    leases = [runtime.pools["a"].acquire() for _ in range(3)]
    assert load() == {"a": 13, "b": 10}, "max(in flight, reported) would still say 10"
    leases[0].release(True)
    assert load()["a"] == 12
    runtime.reported.publish({"a": 4})  # a new report holds what is in flight now
    assert load() == {"a": 4, "b": 0}
    runtime.pools["b"].acquire()
    assert load() == {"a": 4, "b": 1}


def test_a_burst_between_two_reports_splits_between_identical_pools():
    runtime, load = rig()
    runtime.reported.publish({"a": 10, "b": 10})
    model = LatencyModel(clock=lambda: 0.0)
    for _ in range(50):  # measured alike, `a` a hair faster: the case a burst herds on
        model.observe("a", "chat/greedy", 10, 0.0100, 0.00100)
        model.observe("b", "chat/greedy", 10, 0.0105, 0.00105)
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 64}
    rng, flags = random.Random(5), FlagStore(()).snapshot()
    chosen: Counter[str] = Counter()
    for _ in range(24):
        features = extract_features(body, "chat", POLICY.defaults, POLICY.classifier, load())
        pool = decide(features, POLICY, flags, 0.5, model, rng).pool
        runtime.pools[pool].acquire()  # the lease, taken before the next decision as in the gateway
        chosen[pool] += 1
    assert min(chosen["a"], chosen["b"]) >= 6, chosen
