"""`specgate serve --workers N`: refused without a state store; N gateways on
one port, each serving; SIGTERM stops them all; a dead worker stops the rest."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.fakes.process import REPO_ROOT
from tests.fakes.redis_server import RedisServer
from tests.fakes.vllm import FakeVllm
from tests.integration.state.workers import ServeWorkers, alive
from tests.soak.gateway_process import one_pool_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # a real redis-server, gateways as processes

REQUESTS = 41  # odd: two workers cannot have served the same number
REQUEST_COUNT = re.compile(r"^specgate_requests_total\{[^}]*\} (\S+)$", re.MULTILINE)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="fake-model", kind="standard") as backend:
        yield backend


@pytest.fixture
def two_workers(tmp_path: Path, redis: RedisServer, fake: FakeVllm) -> Iterator[ServeWorkers]:
    policy = one_pool_policy(tmp_path, {"endpoints": [{"url": fake.url}]})
    serve = ServeWorkers(policy, tmp_path / "serve.log", 2, {"SPECGATE_STATE_URL": redis.url})
    yield serve
    serve.stop()


def test_more_than_one_worker_needs_a_state_store(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "SPECGATE_STATE_URL"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run([sys.executable, "-m", "specgate.cli", "serve", "--workers", "2", "--port", "0"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "specgate serve: --workers 2 needs SPECGATE_STATE_URL (redis://, rediss:// or unix://): without "
        "a shared store each worker keeps its own overrides, guard and load"]


def served_counts(url: str, scrapes: int) -> set[float]:
    """Requests answered as each scrape's worker counts them; every scrape on a new connection."""
    counts = set()
    for _ in range(scrapes):
        text = httpx.get(f"{url}/metrics", headers={"Connection": "close"}, timeout=10).text
        counts.add(sum(float(value) for value in REQUEST_COUNT.findall(text)))
    return counts


def test_two_workers_serve_one_port_and_stop_together(two_workers: ServeWorkers) -> None:
    workers = two_workers.wait_listening(2)
    no_keepalive = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
    with openai.OpenAI(base_url=f"{two_workers.url}/v1", api_key="unused", http_client=no_keepalive) as client:
        for _ in range(REQUESTS):
            answer = client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
            assert answer.choices[0].message.content
    counts = served_counts(two_workers.url, 40)
    # each worker counts only what it served: two counts that add up to every request
    assert len(counts) == 2 and 0 not in counts and sum(counts) == REQUESTS, counts

    two_workers.process.send_signal(signal.SIGTERM)
    assert two_workers.wait_exit() == 0, two_workers.log.read_text()
    assert not any(alive(pid) for pid in workers)


def test_a_dead_worker_stops_the_others_and_serve_fails(two_workers: ServeWorkers) -> None:
    killed, survivor = sorted(two_workers.wait_listening(2))
    os.kill(killed, signal.SIGKILL)
    assert two_workers.wait_exit() == 1
    assert f"specgate serve: worker {killed} exited with -9; stopped the other 1" in two_workers.log.read_text()
    assert not alive(survivor)  # serve waits for it before exiting
