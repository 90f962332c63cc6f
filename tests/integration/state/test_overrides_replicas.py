"""Three `specgate serve` replicas on one Redis: an override set on one holds on
every one within 1 s, and survives a restart of all three."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.redis_server import RedisServer
from tests.fakes.vllm import FakeVllm
from tests.fakes.waiting import wait_until
from tests.integration.state.serve_replicas import ServeReplica, write_policy

pytestmark = pytest.mark.slow  # a real redis-server

PROPAGATION_BOUND_S = 1.0


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[ServeReplica]]:
    with RedisServer(tmp_path / "redis") as redis, \
            FakeVllm(model="upstream-spec", kind="speculative") as spec, \
            FakeVllm(model="upstream-std", kind="standard") as std:
        policy = write_policy(tmp_path / "policy.yaml", spec.url, std.url)
        started = [ServeReplica(name, policy, redis.url, tmp_path / f"{name}.log") for name in "abc"]
        try:
            for replica in started:
                replica.start()
            yield started
        finally:
            for replica in started:
                replica.stop()


def shows(replica: ServeReplica, mode: str, version: int) -> bool:
    flag = replica.flags()["speculative"]
    return bool(flag["mode"] == mode and flag["override"]["version"] == version)


def test_an_override_on_one_replica_steers_the_others_and_survives_restarting_all(
        replicas: list[ServeReplica], record_property: pytest.RecordProperty) -> None:
    a, b, c = replicas
    answer = a.put_mode("speculative", "force_off")
    assert answer.status_code == 200, answer.text
    written = answer.json()["speculative"]["override"]
    assert written["version"] is not None and not written["pending"]
    delays = {}
    for other in (b, c):
        wait_until(lambda other=other: shows(other, "force_off", written["version"]),
                   f"replica {other.name} applies the override")
        override = other.flags()["speculative"]["override"]
        assert override["written_at"] == pytest.approx(written["written_at"])
        # The bound, as states: when this replica applied the override against when it was stored.
        delays[other.name] = override["applied_at"] - override["written_at"]
    record_property("propagation_delays_s", delays)
    print(f"override propagation delays (s): {delays}")
    assert all(0 <= delay < PROPAGATION_BOUND_S for delay in delays.values()), delays
    assert all(not replica.flags()["speculative"]["enabled"] for replica in replicas)

    for replica in replicas:
        replica.stop()
    for replica in replicas:
        replica.start()  # answers /healthz only after reading the stored overrides
    for replica in replicas:
        flag = replica.flags()["speculative"]
        assert (flag["mode"], flag["override"]["version"]) == ("force_off", written["version"]), replica.name
        assert flag["reason"] == "admin:force_off"
