"""Where a request's priority comes from: the header (checked, capped by the
key), the key's configuration, a policy rule; and the policy's checks of
the priority fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.edge.auth import ClientKeys, Grant
from gateway.edge.priority import request_priority
from gateway.errors import InvalidRequest
from gateway.policy.loader import PolicyError, parse_policy
from gateway.policy.priority import claimed, resolve, tier

POLICY = """version: 1
pools:
  a: {kind: standard, endpoints: [{url: 'http://127.0.0.1:9000'}]%s}
rules:
  - {name: short, when: {max_tokens: {lt: 32}}, route: a, priority: %s}
  - {name: all, route: a}
"""


@pytest.mark.parametrize("value,expected", [(None, None), ("5", 5), (" -3 ", -3), ("+7", 7), ("1000", 1000),
                                            ("-1000", -1000), ("0", 0)])
def test_the_header_claims_an_integer_in_range(value, expected):
    assert claimed(value) == expected


@pytest.mark.parametrize("value", ["", "high", "1.5", "1e3", "0x10", "1001", "-1001", "99999", "5 5"])
def test_a_header_that_is_not_an_integer_in_range_is_a_400_naming_it(value):
    with pytest.raises(InvalidRequest) as bad:
        claimed(value)
    assert bad.value.status_code == 400 and bad.value.param == "x-specgate-priority"
    assert "-1000 to 1000" in bad.value.message


@pytest.mark.parametrize("key,cap,rule,header,expected", [
    (0, 0, None, None, 0),  # nothing says anything: 0
    (3, 3, None, None, 3),  # the key's own
    (3, 3, 8, None, 8),  # a rule's replaces the key's
    (3, 3, -2, None, -2),
    (0, 0, None, -5, -5),  # the header may always lower
    (0, 0, None, 5, 0),  # but not raise past the cap
    (3, 10, None, 7, 7),  # up to the key's max_priority
    (3, 10, None, 50, 10),
    (0, 0, 8, 20, 8),  # a rule's priority is not the client's to raise
    (0, 0, 8, 2, 2),
])
def test_the_sources_in_order_and_the_header_capped(key, cap, rule, header, expected):
    assert resolve(key, cap, rule, header) == expected


def test_tiers_are_three():
    assert [tier(p) for p in (-1000, -1, 0, 1, 1000)] == ["low", "low", "normal", "high", "high"]


def test_a_key_file_sets_a_key_s_priority_and_cap(tmp_path: Path):
    path = tmp_path / "keys.yaml"
    path.write_text("- {key: batch, priority: -10}\n- {key: app, priority: 1, max_priority: 50}\n- {key: plain}\n")
    keys = ClientKeys.load(None, path)
    batch, app, plain = (keys.authenticate(f"Bearer {k}") for k in ("batch", "app", "plain"))
    assert (batch.priority, batch.cap) == (-10, -10)
    assert (app.priority, app.cap) == (1, 50)
    assert (plain.priority, plain.cap) == (0, 0)


@pytest.mark.parametrize("entry", ["{key: k, priority: high}", "{key: k, priority: 2000}",
                                   "{key: k, max_priority: true}", "{key: k, priority: 1.5}"])
def test_a_key_file_s_bad_priority_is_refused_naming_the_entry(tmp_path: Path, entry):
    path = tmp_path / "keys.yaml"
    path.write_text(f"- {entry}\n")
    with pytest.raises(ValueError, match="entry 0: '(max_)?priority' must be an integer from -1000 to 1000"):
        ClientKeys.load(None, path)


def test_the_edge_reads_the_header_the_key_and_the_matched_rule():
    policy = parse_policy(POLICY % ("", "5"))
    app = Grant(None, priority=1, max_priority=20)
    assert request_priority({}, None, policy, "all") == 0
    assert request_priority({}, None, policy, "short") == 5
    assert request_priority({}, app, policy, "all") == 1
    assert request_priority({"x-specgate-priority": "15"}, app, policy, "short") == 15
    assert request_priority({"x-specgate-priority": "15"}, None, policy, "short") == 5
    assert request_priority({"x-specgate-priority": "-4"}, None, policy, None) == -4
    with pytest.raises(InvalidRequest):
        request_priority({"x-specgate-priority": "urgent"}, app, policy, "all")


@pytest.mark.parametrize("pool,rule,message", [
    ("", "1001", "rules[0].priority: Input should be less than or equal to 1000"),
    (", priority: {busy_load: 8}", "1", "busy_load needs shed_below"),
    (", priority: {shed_below: 0, busy_load: 0}", "1", "pools.a.priority.busy_load"),
    (", priority: {shed_below: 0, reserve: 2}", "1", "pools.a.priority.reserve: unknown key"),
])
def test_the_policy_s_priority_fields_are_checked_with_their_line(pool, rule, message):
    with pytest.raises(PolicyError) as bad:
        parse_policy(POLICY % (pool, rule), "p.yaml")
    assert message in str(bad.value)
    assert str(bad.value).startswith("p.yaml:")
