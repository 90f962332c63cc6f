"""Fleet-wide load through a real Redis: a burst through one replica moves
another's routing within the refresh bound, and a killed replica's counts
vanish with their TTL."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from openai import OpenAI

from tests.fakes.process import free_port, spawn_module, wait_until_ok
from tests.fakes.redis_server import RedisServer
from tests.fakes.vllm import FakeVllm
from tests.fakes.waiting import wait_until
from tests.integration.state.fleet_rig import ADMIN_TOKEN, Replica, policy

pytestmark = pytest.mark.slow  # a real redis-server

BURST = 4  # streams held open on replica A; the policy's busy threshold too
FLEET_KEYS = "specgate:default:fleet:load:*"
REPLICAS_KEY = "specgate:default:fleet:replicas"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def fakes() -> Iterator[tuple[FakeVllm, FakeVllm]]:
    with FakeVllm(model="upstream-spec", kind="speculative") as spec, \
            FakeVllm(model="upstream-std", kind="standard") as std:
        spec.script(text="one two three four five six", chunks=6)
        yield spec, std


@pytest.fixture
def replica(tmp_path: Path, redis_server: RedisServer,
            fakes: tuple[FakeVllm, FakeVllm]) -> Iterator[Callable[[str], Replica]]:
    started: list[Replica] = []

    def start(name: str) -> Replica:
        spec, std = fakes
        started.append(Replica(tmp_path / name, policy(spec.url, std.url, BURST), redis_server.url))
        return started[-1]

    yield start
    for one in started:
        one.stop()


def open_streams(base_url: str, count: int) -> tuple[OpenAI, list[Any]]:
    """`count` chat streams, each read to its first chunk: in flight, held by the fake."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    streams = []
    for _ in range(count):
        stream = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=64, stream=True)
        next(iter(stream))
        streams.append(stream)
    return client, streams


def close_streams(client: OpenAI, streams: list[Any]) -> None:
    for stream in streams:
        stream.close()
    client.close()


def speculative_load(replica: Replica) -> int:
    load: int = replica.explain()["features"]["load"]["speculative"]
    return load


def test_a_burst_through_replica_a_moves_replica_bs_routing_within_the_refresh_bound(replica, fakes):
    spec, _ = fakes
    a, b = replica("a"), replica("b")
    before = b.explain()
    assert (before["pool"], before["features"]["load"]["speculative"]) == ("speculative", 0)
    hold = spec.hold()
    client, streams = open_streams(a.base_url, BURST)
    try:
        assert a.parts.runtime.pools["speculative"].in_flight == BURST
        # The bound, as events: a refresh of A that began after the burst was in
        # flight has published it, then a refresh of B that began after that has read it.
        assert a.parts.fleet is not None and b.parts.fleet is not None
        published = a.parts.fleet.refreshes + 2
        wait_until(lambda: a.parts.fleet.refreshes >= published, "replica A publishes its counts")
        read = b.parts.fleet.refreshes + 2
        wait_until(lambda: b.parts.fleet.refreshes >= read, "replica B reads the fleet's counts")
        after = b.explain()
        assert after["features"]["load"]["speculative"] >= BURST
        assert (after["pool"], after["rule"]) == ("standard", "busy")
        assert b.parts.runtime.pools["speculative"].in_flight == 0  # none of it is B's own
        assert b.parts.metrics.registry.get_sample_value("specgate_fleet_replicas") == 1
    finally:
        hold.set()
        close_streams(client, streams)
    wait_until(lambda: speculative_load(b) == 0, "the burst's end reaches replica B")


def test_a_killed_replicas_counts_vanish_after_their_ttl(tmp_path, replica, redis_server, fakes):
    spec, std = fakes
    b = replica("b")
    path = tmp_path / "a-policy.yaml"
    path.write_text(yaml.safe_dump(policy(spec.url, std.url, BURST), sort_keys=False))
    port = free_port()
    env = {"SPECGATE_STATE_URL": redis_server.url, "SPECGATE_ADMIN_TOKEN": ADMIN_TOKEN}
    a = spawn_module("specgate.cli", "serve", "--policy", str(path), "--host", "127.0.0.1", "--port", str(port),
                     "--log-level", "warning", env=env, stderr=subprocess.DEVNULL)
    store = redis.Redis.from_url(redis_server.url)
    hold = spec.hold()
    client, streams = None, []
    try:
        wait_until_ok(f"http://127.0.0.1:{port}/healthz", a)
        client, streams = open_streams(f"http://127.0.0.1:{port}/v1", BURST)
        wait_until(lambda: speculative_load(b) >= BURST, "replica B sees replica A's burst")
        assert len(store.keys(FLEET_KEYS)) == 1  # A's hash; B, with nothing in flight, writes none
        assert len(store.zrange(REPLICAS_KEY, 0, -1)) == 2
        a.send_signal(signal.SIGKILL)
        a.wait()
        # Nothing takes A's counts out but their TTL: B keeps them until then.
        assert b.parts.fleet is not None and b.parts.fleet.others().pool("speculative") >= BURST
        wait_until(lambda: speculative_load(b) == 0, "replica A's counts expire")
        assert store.keys(FLEET_KEYS) == []
        wait_until(lambda: b.parts.fleet.others().replicas == 0, "replica B counts no other replica")
        assert [member.decode() for member in store.zrange(REPLICAS_KEY, 0, -1)] == [b.parts.fleet.replica]
    finally:
        hold.set()
        if a.poll() is None:
            a.kill()
            a.wait()
        if client is not None:
            close_streams(client, streams)
        store.close()
