"""Shared learning through a real Redis: what replica A measures shows up in
replica B's latency model (GET /admin/latency)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.fakes.redis_server import RedisServer
from tests.fakes.vllm import FakeVllm
from tests.fakes.waiting import wait_until
from tests.integration.state.fleet_rig import Replica, policy

pytestmark = pytest.mark.slow  # a real redis-server


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    with RedisServer(tmp_path / "redis") as server, \
            FakeVllm(model="upstream-spec", kind="speculative") as spec, \
            FakeVllm(model="upstream-std", kind="standard") as std:
        spec.script(text="one two three four", chunks=4, delay=0.01)
        rules = policy(spec.url, std.url, busy_at=1000)
        replicas = [Replica(tmp_path / "a", rules, server.url), Replica(tmp_path / "b", rules, server.url)]
        try:
            yield replicas[0], replicas[1]
        finally:
            for replica in replicas:
                replica.stop()


def samples(snapshot: dict[str, Any], pool: str) -> float:
    """The observations a model holds for `pool`, over its classes and load buckets."""
    return sum(sum(pair["tpot"]["samples"]) for pair in snapshot["pairs"] if pair["pool"] == pool)


def test_observations_made_on_replica_a_show_up_in_replica_bs_latency_model(pair):
    a, b = pair
    assert a.parts.learning is not None and b.parts.learning is not None
    assert samples(b.latency(), "speculative") == 0
    with OpenAI(base_url=a.base_url, api_key="unused", max_retries=0, timeout=30) as client:
        for _ in range(3):
            stream = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=64, stream=True)
            assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    wait_until(lambda: samples(a.latency(), "speculative") > 0, "replica A measures its answers")
    wait_until(lambda: b.parts.learning.received >= 3, "replica B reads replica A's observations")
    on_b = b.latency()
    assert samples(on_b, "speculative") > 0
    assert {p["class"] for p in on_b["pairs"]} == {p["class"] for p in a.latency()["pairs"]}
    assert b.parts.learning.sent == 0  # B served nothing: all it holds came from A
    assert a.parts.learning.received == 0  # and A does not read its own entries back
    sent = a.parts.metrics.registry.get_sample_value("specgate_shared_observations_total", {"direction": "sent"})
    got = b.parts.metrics.registry.get_sample_value("specgate_shared_observations_total",
                                                    {"direction": "received"})
    assert sent == a.parts.learning.sent >= 3 and got == b.parts.learning.received
