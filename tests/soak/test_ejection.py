"""Passive ejection under load: an endpoint that fails every request sees one
trial per back-off once ejected, whatever path its failures take (answered
to the client, or retried elsewhere)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.vllm import FakeVllm
from tests.soak.checks import backoff_violations
from tests.soak.gateway_process import GatewayProcess, one_pool_policy
from tests.soak.load import run_load

pytestmark = [pytest.mark.soak, pytest.mark.timeout(120)]

HEALTH = {"interval_s": 0.5, "eject_after": 3, "backoff_s": 0.4, "max_backoff_s": 0.8}


@pytest.fixture
def fakes() -> Iterator[list[FakeVllm]]:
    started = [FakeVllm(model="fake-model", kind="standard").start() for _ in range(3)]
    yield started
    for fake in started:
        fake.stop()


def serve(tmp_path: Path, fakes: list[FakeVllm], retry: dict) -> GatewayProcess:
    endpoints = [{"url": fakes[0].url, "max_in_flight": 1}, *({"url": f.url} for f in fakes[1:])]
    pool = {"endpoints": endpoints, "health": HEALTH, "retry": retry,
            "timeouts": {"connect_s": 0.5, "first_byte_s": 2, "total_s": 4}}
    return GatewayProcess(one_pool_policy(tmp_path, pool), tmp_path / "gateway.log").start()


def drive(gateway: GatewayProcess, requests: int = 600) -> None:
    report = asyncio.run(run_load(gateway.url, requests, concurrency=16, timeout_s=6.0))
    assert report.violations() == {}, report.outcomes


@pytest.mark.parametrize("status", [500, 503])
def test_a_failing_answer_counts_against_the_endpoint_when_nothing_is_retried(tmp_path, fakes, status):
    sick = fakes[0]
    sick.faults_at_random(seed=1, fail_rate=1.0, fail_status=status)
    assert_sick_endpoint_respects_backoff(tmp_path, fakes, sick, retry={"attempts": 1})


def test_retries_never_land_on_an_ejected_endpoint(tmp_path, fakes):
    sick, flaky, busy = fakes
    sick.faults_at_random(seed=1, fail_rate=1.0, fail_status=503)
    flaky.faults_at_random(seed=2, fail_rate=0.5, fail_status=503)
    busy.faults_at_random(seed=3, fail_rate=0.5, fail_status=429)
    assert_sick_endpoint_respects_backoff(tmp_path, fakes, sick, retry={"attempts": 3, "budget_ratio": 1.0})


def assert_sick_endpoint_respects_backoff(tmp_path, fakes, sick, retry) -> None:
    """Drive load through a gateway; the always-failing endpoint must be ejected
    and then see at most one request per back-off."""
    gateway = serve(tmp_path, fakes, retry=retry)
    try:
        drive(gateway)
    finally:
        gateway.stop()
    arrivals = [r.received_at for r in sick.completion_requests()]
    assert len(arrivals) >= HEALTH["eject_after"]
    assert backoff_violations(arrivals, HEALTH) == []
