"""Three `specgate serve` replicas serve through a Redis SIGKILL with their
last-known overrides and `specgate_state_up 0`, and converge when Redis comes
back on the same port."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from openai import OpenAI

from tests.fakes.redis_server import RedisServer
from tests.fakes.vllm import FakeVllm
from tests.fakes.waiting import wait_until
from tests.integration.state.serve_replicas import ServeReplica, write_policy

pytestmark = pytest.mark.slow  # a real redis-server

REQUESTS = 60
CONCURRENCY = 6


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[RedisServer, list[ServeReplica]]]:
    with RedisServer(tmp_path / "redis") as redis, \
            FakeVllm(model="upstream-spec", kind="speculative") as spec, \
            FakeVllm(model="upstream-std", kind="standard") as std:
        spec.script(delay=0.02)
        std.script(delay=0.02)
        policy = write_policy(tmp_path / "policy.yaml", spec.url, std.url)
        started = [ServeReplica(name, policy, redis.url, tmp_path / f"{name}.log") for name in "abc"]
        try:
            for replica in started:
                replica.start()
            yield redis, started
        finally:
            for replica in started:
                replica.stop()


class Load:
    """`REQUESTS` chat completions through the replicas in turn, with the official client."""

    def __init__(self, replicas: list[ServeReplica]) -> None:
        self.clients = [OpenAI(base_url=f"{r.url}/v1", api_key="unused", max_retries=0, timeout=30)
                        for r in replicas]
        self.turn = itertools.cycle(self.clients)
        self.lock = threading.Lock()
        self.pools: list[str] = []

    def one(self) -> str:
        with self.lock:
            client = next(self.turn)
        response = client.chat.completions.with_raw_response.create(
            model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0)
        response.parse()
        pool = response.headers["x-specgate-pool"]
        with self.lock:
            self.pools.append(pool)
        return pool

    def close(self) -> None:
        for client in self.clients:
            client.close()


def all_show(replicas: list[ServeReplica], mode: str) -> bool:
    return all(replica.flags()["speculative"]["mode"] == mode for replica in replicas)


def test_a_redis_sigkill_under_load_fails_no_request_and_converges_after(fleet) -> None:
    redis, replicas = fleet
    a, b, c = replicas
    assert a.put_mode("speculative", "force_off").status_code == 200
    wait_until(lambda: all_show(replicas, "force_off"), "every replica applies the override")
    assert all(replica.metric("specgate_state_up") == 1 for replica in replicas)

    load = Load(replicas)
    try:
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            first: list[Future[str]] = [pool.submit(load.one) for _ in range(REQUESTS // 2)]
            wait_until(lambda: sum(f.done() for f in first) >= REQUESTS // 6, "the load is under way")
            redis.kill()
            wait_until(lambda: all(r.metric("specgate_state_up") == 0 for r in replicas),
                       "every replica sees the store down")
            second = [pool.submit(load.one) for _ in range(REQUESTS - REQUESTS // 2)]
            failures = [f.exception() for f in first + second if f.exception() is not None]
    finally:
        load.close()
    assert failures == []
    assert len(load.pools) == REQUESTS and set(load.pools) == {"standard"}, "force_off held throughout"
    assert all_show(replicas, "force_off"), "the last-known override stays"
    for replica in replicas:
        assert replica.log_text().count("state_store_down") == 1, replica.name  # one warning per outage

    held = b.put_mode("speculative", "force_on")  # while the store is down: holds on B, written later
    assert held.status_code == 202 and held.json()["speculative"]["override"]["pending"] is True
    assert b.flags()["speculative"]["mode"] == "force_on"
    assert a.flags()["speculative"]["mode"] == c.flags()["speculative"]["mode"] == "force_off"

    redis.start()  # the same port and data directory
    wait_until(lambda: all(r.metric("specgate_state_up") == 1 for r in replicas), "every replica sees it back")
    wait_until(lambda: all_show(replicas, "force_on"), "B's held override reaches every replica")
    assert c.put_mode("speculative", "auto").status_code == 200
    wait_until(lambda: all_show(replicas, "auto"), "a new override reaches every replica")
