"""`specgate up` starts the policy's fleet: one local backend per pool, of the
pool's kind, and the policy pointed at them as they run (`fleet`, `policy_for`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from backends.vllm import load_profiles
from gateway.policy.loader import load_policy
from gateway.settings import default_policy_path
from specgate.replicas import command_backend, engine_backend, fleet, policy_for, vllm_backend
from specgate.up import Stack, StartError, gateway_service

STAGGERED = {"drafting-late": [[1, 4, 2], [5, 5, 0]], "drafting-early": [[1, 2, 2], [3, 3, 0]]}
DEFAULT_SCHEDULE = [[1, 16, 3], [17, 17, 0]]  # the default's drafting pool: 3 draft tokens up to 16 sequences


def staggered_policy(tmp_path: Path, schedules: dict[str, list[list[int]]] = STAGGERED) -> Path:
    """The default policy with its two pools replaced by two dynamic ones that switch at different batches."""
    data = yaml.safe_load(default_policy_path().read_text())
    data["pools"] = {name: {"kind": "dynamic", "speculation_schedule": schedule, "model": "smollm2",
                            "endpoints": [{"url": "http://replica.internal:8000"}]}
                     for name, schedule in schedules.items()}
    data["default_pool"] = next(iter(schedules))
    path = tmp_path / "staggered.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def spec_config(service) -> dict | None:
    argv = service.argv
    return json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None


def test_the_default_runs_as_it_is_on_8001_and_8002(tmp_path):
    default = default_policy_path()
    replicas = fleet(default)
    assert [(r.pool, r.kind, r.port, r.schedule) for r in replicas] == \
        [("speculative", "dynamic", 8001, DEFAULT_SCHEDULE), ("standard", "standard", 8002, None)]
    assert policy_for(default, replicas, tmp_path) == default
    assert policy_for(default, fleet(default, None, "speculative-ngram"), tmp_path) == default
    assert policy_for(default, fleet(default, None, "dynamic-ngram"), tmp_path) == default  # its own schedule
    assert not list(tmp_path.iterdir())
    drafting = spec_config(vllm_backend(replicas[0], tmp_path, tmp_path, "python3"))
    assert drafting["num_speculative_tokens_per_batch_size"] == DEFAULT_SCHEDULE


def test_moved_ports_and_a_dynamic_profile_are_stated_in_a_copy(tmp_path):
    data = yaml.safe_load(default_policy_path().read_text())
    data["pools"]["speculative"] = {**data["pools"]["speculative"], "kind": "speculative"}
    del data["pools"]["speculative"]["speculation_schedule"]
    default = tmp_path / "always-drafting.yaml"  # a pool that drafts at every batch
    default.write_text(yaml.safe_dump(data, sort_keys=False))
    moved = load_policy(policy_for(default, fleet(default, (18001, 18002), "speculative-ngram"), tmp_path))
    assert [e.url for e in moved.pools["speculative"].endpoints] == ["http://127.0.0.1:18001"]
    assert [e.url for e in moved.pools["standard"].endpoints] == ["http://127.0.0.1:18002"]
    assert moved.pools["speculative"].kind == "speculative"
    dynamic = load_policy(policy_for(default, fleet(default, None, "dynamic-ngram"), tmp_path))
    _, profiles = load_profiles()
    assert dynamic.pools["speculative"].kind == "dynamic"
    assert [list(r) for r in dynamic.schedules["speculative"].ranges] == \
        profiles["dynamic-ngram"].speculation_schedule.as_list()
    assert dynamic.standard_pools == ("standard",) and "speculative" in dynamic.speculative_pools


def test_each_dynamic_pool_gets_a_replica_drafting_by_its_own_schedule(tmp_path):
    policy = staggered_policy(tmp_path)
    replicas = fleet(policy)
    assert [(r.pool, r.kind, r.port) for r in replicas] == \
        [("drafting-late", "dynamic", 8001), ("drafting-early", "dynamic", 8002)]
    for replica in replicas:
        config = spec_config(vllm_backend(replica, tmp_path, tmp_path, "python3"))
        assert config["method"] == "eagle3"  # the drafting pools' profile, the default one
        assert config["num_speculative_tokens_per_batch_size"] == STAGGERED[replica.pool]
        engine = engine_backend(replica, tmp_path, "python3").argv
        assert json.loads(engine[engine.index("--speculation-schedule") + 1]) == STAGGERED[replica.pool]
        assert "--no-speculation" not in engine
    run = load_policy(policy_for(policy, replicas, tmp_path / "policies"))
    assert {name: [e.url for e in pool.endpoints] for name, pool in run.pools.items()} == \
        {"drafting-late": ["http://127.0.0.1:8001"], "drafting-early": ["http://127.0.0.1:8002"]}
    assert {name: [list(r) for r in schedule.ranges] for name, schedule in run.schedules.items()} == STAGGERED


def test_a_standard_pool_is_served_plain_and_every_pool_has_its_own_backend(tmp_path):
    data = yaml.safe_load(default_policy_path().read_text())
    data["pools"]["second-standard"] = {"kind": "standard", "endpoints": [{"url": "http://x.internal:1"}]}
    policy = tmp_path / "three.yaml"
    policy.write_text(yaml.safe_dump(data, sort_keys=False))
    replicas = fleet(policy, (9001, 9002, 9003))
    services = [vllm_backend(r, tmp_path, tmp_path, "python3") for r in replicas]
    assert [spec_config(s) is None for s in services] == [False, True, True]
    assert [s.port for s in services] == [9001, 9002, 9003]
    assert len({s.log for s in services}) == 3
    engines = [engine_backend(r, tmp_path, "python3") for r in replicas]
    assert ["--no-speculation" in e.argv for e in engines] == [False, True, True]
    assert [e.argv[e.argv.index("--speculation-schedule") + 1] if "--speculation-schedule" in e.argv else None
            for e in engines] == [json.dumps(DEFAULT_SCHEDULE), None, None]
    commands = [command_backend("{python} serve --port {port} --kind {kind} --pool {pool}", r, tmp_path, "py")
                for r in replicas]
    assert commands[2].argv == ["py", "serve", "--port", "9003", "--kind", "standard", "--pool", "second-standard"]


def test_a_schedule_drafts_as_deep_as_it_says_whatever_the_profile_drafts(tmp_path):
    schedules = {"deep": [[1, 4, 4], [5, 5, 0]], "shallow": [[1, 2, 1], [3, 3, 0]]}
    deep, shallow = fleet(staggered_policy(tmp_path, schedules))
    by_head = spec_config(vllm_backend(deep, tmp_path, tmp_path, "python3"))  # the head's profile drafts 2
    assert by_head["num_speculative_tokens"] == 4 and by_head["method"] == "eagle3"  # not capped at 2 by vLLM
    by_ngram = spec_config(vllm_backend(shallow, tmp_path, tmp_path, "python3", "dynamic-ngram"))
    assert by_ngram["num_speculative_tokens_per_batch_size"] == [[1, 2, 1], [3, 3, 0]]  # the pool's, not the profile's
    assert by_ngram["num_speculative_tokens"] == 1 and by_ngram["method"] == "ngram"
    with pytest.raises(StartError, match="choose one of: .*speculative-eagle3-local"):
        vllm_backend(deep, tmp_path, tmp_path, "python3", "standard")


@pytest.mark.parametrize(("ports", "message"), [
    ((8001,), "has 2 pools .speculative, standard. and --backend-ports gives 1 ports"),
    ((8001, 8002, 8003), "gives 3 ports: one port per pool"),
])
def test_ports_that_do_not_fit_the_pools_are_refused(ports, message):
    with pytest.raises(StartError, match=message):
        fleet(default_policy_path(), ports)


def test_a_broken_policy_and_a_hostile_pool_name_stay_clear(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\npools: [\n")
    with pytest.raises(StartError, match="broken.yaml:"):
        fleet(broken)
    policy = staggered_policy(tmp_path, {"../../escape": [[1, 2, 2], [3, 3, 0]]})
    service = vllm_backend(fleet(policy)[0], tmp_path, tmp_path / "logs", "python3")
    assert service.log.parent == tmp_path / "logs" and "/" not in service.log.name


def test_the_bundled_engines_batch_cap_is_stated_so_requests_past_it_wait_at_the_gateway(tmp_path):
    default = default_policy_path()
    run = load_policy(policy_for(default, fleet(default), tmp_path, batch_cap=8))
    assert {name: pool.max_in_flight for name, pool in run.pools.items()} == {"speculative": 8, "standard": 8}
    data = yaml.safe_load(default.read_text())
    data["pools"]["standard"]["max_in_flight"] = 4  # a lower cap of the policy's own stays
    lower = tmp_path / "lower.yaml"
    lower.write_text(yaml.safe_dump(data, sort_keys=False))
    run = load_policy(policy_for(lower, fleet(lower), tmp_path, batch_cap=8))
    assert {name: pool.max_in_flight for name, pool in run.pools.items()} == {"speculative": 8, "standard": 4}


def test_two_services_given_one_port_are_named_before_anything_starts(tmp_path):
    default = default_policy_path()
    backends = [command_backend("{python} -c pass", r, tmp_path) for r in fleet(default, (18001, 18080))]
    stack = Stack(backends, gateway_service(default, 18080, tmp_path))
    both = r"standard backend \(:18080\) and gateway \(:18080\) are both given port 18080"
    with pytest.raises(StartError, match=both):
        stack.start()
    assert all(service.process is None for service in stack.services)
