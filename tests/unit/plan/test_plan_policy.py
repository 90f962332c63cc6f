"""`specgate plan --policy`: the recommended fleet as a policy the gateway loads and `up` runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from backends.speculation import SpeculationSchedule
from gateway.policy.loader import load_policy
from gateway.settings import default_policy_path
from specgate.cli import main
from specgate.plan.options import Option
from specgate.plan.policy import policy_text
from specgate.replicas import fleet

LATE, EARLY = SpeculationSchedule.switch(16, 4), SpeculationSchedule.switch(8, 4)
SLO = {"ttft_s": 1.0, "tpot_s": 0.05}


def written(tmp_path: Path, option: Option) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(policy_text(option, SLO, default_policy_path(), "a line about the plan"))
    return path


def test_the_recommendation_is_written_as_a_policy_the_gateway_loads(tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text("phases: [{duration_s: 60, rate: 2}]\n"
                        "classes: [{domain: code, temperature: 0, max_tokens: 256}]\n")
    out = tmp_path / "out" / "fleet.yaml"
    assert main(["plan", str(workload), "--gpus", "2", "--kinds", "speculative,standard", "--policy", str(out)]) == 0
    assert "recommended: 2 speculative" in capsys.readouterr().out
    assert out.read_text().startswith("# The fleet `specgate plan` recommends: 2 speculative.\n")
    policy = load_policy(out)
    assert list(policy.pools) == ["speculative"] and policy.default_pool == "speculative"
    assert [e.url for e in policy.pools["speculative"].endpoints] == \
        ["http://speculative-1.internal:8000", "http://speculative-2.internal:8000"]
    assert (policy.pools["speculative"].slo.ttft_s, policy.pools["speculative"].slo.tpot_s) == (1.0, 0.05)
    default = load_policy(default_policy_path())
    assert [(r.name, r.route) for r in policy.rules] == [(r.name, r.route) for r in default.rules]
    assert policy.spec.guard == default.spec.guard and policy.spec.domains == default.spec.domains  # the default's


def test_a_staggered_fleet_is_two_dynamic_pools_falling_back_in_turn(tmp_path):
    policy = load_policy(written(tmp_path, Option(0, 0, (LATE, EARLY))))
    assert {name: (pool.kind, pool.speculation_schedule, pool.fallback) for name, pool in policy.pools.items()} == {
        "dynamic-a": ("dynamic", LATE.as_list(), "dynamic-b"), "dynamic-b": ("dynamic", EARLY.as_list(), None)}
    assert policy.default_pool == "dynamic-a"
    replicas = fleet(written(tmp_path, Option(0, 0, (LATE, EARLY))))  # what `up --policy` would start
    assert [(r.pool, r.kind, r.schedule) for r in replicas] == \
        [("dynamic-a", "dynamic", LATE.as_list()), ("dynamic-b", "dynamic", EARLY.as_list())]


def test_drafting_pools_fall_back_to_the_standard_one(tmp_path):
    data = yaml.safe_load(written(tmp_path, Option(2, 3, (EARLY,))).read_text())
    pools = data["pools"]
    assert list(pools) == ["speculative", "dynamic", "standard"] and data["default_pool"] == "standard"
    assert [len(pools[name]["endpoints"]) for name in pools] == [2, 1, 3]
    assert pools["speculative"]["fallback"] == pools["dynamic"]["fallback"] == "standard"
    assert "fallback" not in pools["standard"]
    load_policy(tmp_path / "fleet.yaml")  # valid as written
