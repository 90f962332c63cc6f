"""Fleet-wide load without Redis: what a replica publishes, how the others'
hashes add up, and how a decision and an endpoint choice read the sum."""

from __future__ import annotations

import json
import random
from types import MappingProxyType

from gateway.edge.load_view import DecisionLoad
from gateway.load import LoadReport
from gateway.policy.loader import parse_policy
from gateway.state.fleet_load import NOWHERE, Elsewhere, LocalCounts, summed
from gateway.state.shared_learning import Observation, parsed
from gateway.upstream.runtime import Runtime

POLICY = parse_policy("""
version: 1
pools:
  a: {kind: standard, endpoints: [{url: "http://127.0.0.1:1"}, {url: "http://127.0.0.1:2"}]}
  b: {kind: standard, endpoints: [{url: "http://127.0.0.1:3"}]}
rules:
  - {name: default, route: fastest}
""")


def elsewhere(pools: dict[str, int], endpoints: dict[str, dict[str, int]] | None = None) -> Elsewhere:
    return Elsewhere(MappingProxyType(pools), MappingProxyType(endpoints or {}), 1)


def test_only_non_zero_counts_are_published():
    counts = LocalCounts({"a": 2, "b": 0}, {("a", "http://h:1"): 2, ("a", "http://h:2"): 0})
    assert counts.fields() == ["p\ta", "2", "e\ta\thttp://h:1", "2"]


def test_the_other_replicas_hashes_add_up_and_garbage_is_skipped():
    one = [b"p\ta", b"2", b"e\ta\thttp://h:1", b"2"]
    two = [b"p\ta", b"3", b"p\tb", b"1", b"e\ta\thttp://h:1", b"1", b"e\ta\thttp://h:2", b"2"]
    idle: list[bytes] = []
    junk = [b"p\ta", b"many", b"x\ta", b"9", b"e\tno-url", b"4", b"\xff\xfe", b"1", b"p\tb", b"-7"]
    total = summed([one, two, idle, junk, "not a hash"])
    assert dict(total.pools) == {"a": 5, "b": 1}
    assert dict(total.endpoint_counts("a")) == {"http://h:1": 3, "http://h:2": 2}
    assert dict(total.endpoint_counts("b")) == {}
    assert total.replicas == 4  # the idle replica is live, with nothing in flight


def test_runtime_counts_are_what_the_replica_publishes():
    runtime = Runtime(POLICY, LoadReport())
    lease = runtime.pools["a"].acquire()
    counts = runtime.counts()
    assert counts.pools == {"a": 1, "b": 0}
    assert counts.endpoints[("a", lease.endpoint.url)] == 1
    lease.release(True)
    assert runtime.counts().pools == {"a": 0, "b": 0}


def test_a_decision_reads_this_replicas_live_count_plus_the_others():
    others = elsewhere({"a": 5})
    runtime = Runtime(POLICY, LoadReport(), others=lambda: others)
    load = DecisionLoad(runtime)
    leases = [runtime.pools["a"].acquire() for _ in range(2)]
    assert load() == {"a": 7, "b": 0}
    others = NOWHERE  # the other replicas' counts vanished (TTL)
    assert load() == {"a": 2, "b": 0}
    for lease in leases:
        lease.release(True)
    assert load() == {"a": 0, "b": 0}


def test_a_report_counts_the_fleets_leases_since_it_not_only_this_replicas():
    report = LoadReport()
    others = elsewhere({})
    runtime = Runtime(POLICY, report, others=lambda: others)
    load = DecisionLoad(runtime)
    report.publish({"a": 10})
    assert load()["a"] == 10
    others = elsewhere({"a": 4})  # another replica leased 4 since the report
    assert load()["a"] == 14


def busy_share(pool, busy: str) -> float:
    picks = []
    for _ in range(400):
        lease = pool.acquire()
        picks.append(lease.endpoint.url)
        lease.release(True)
    return picks.count(busy) / len(picks)


def test_endpoint_choice_avoids_the_endpoint_busy_on_other_replicas():
    others = NOWHERE
    runtime = Runtime(POLICY, LoadReport(), others=lambda: others)
    pool = runtime.pools["a"]
    pool.rng = random.Random(3)
    busy = pool.endpoints[0].url
    others = elsewhere({"a": 8}, {"a": {busy: 8}})
    # Two draws with replacement: the busy endpoint wins only when both draws are it (1/4).
    assert busy_share(pool, busy) < 0.35
    others = NOWHERE
    assert busy_share(pool, busy) > 0.4  # idle everywhere: a tie, the first draw wins (1/2)


def test_shared_observations_that_do_not_parse_are_left_out():
    good = [["a", "chat", 3, 0.2, 0.01], ["b", "code", 0, None, 0.02]]
    bad = [["a", "chat", -1, 0.2, 0.01], ["a", "chat", 1, "x", 0.1], ["a", 2, 1, 0.1, 0.1], ["a", "c", 1, 0.1],
           ["a", "c", True, 0.1, 0.1], ["a", "c", 1, -0.5, 0.1], "nope"]
    assert parsed(json.dumps(good + bad), 100) == [Observation("a", "chat", 3, 0.2, 0.01),
                                                   Observation("b", "code", 0, None, 0.02)]
    assert parsed(b"{not json", 100) == []
    assert parsed(json.dumps({"a": 1}), 100) == []
    assert len(parsed(json.dumps(good), 1)) == 1
