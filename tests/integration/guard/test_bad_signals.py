"""Signals that are not numbers, or not there, or never finish arriving: the
guard keeps running, the admin API keeps answering JSON, nothing stays stuck."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
import yaml

from backends.serving.server import BackgroundServer
from gateway.control.guard import Guard
from gateway.control.signals import PrometheusSource, ScrapeSource, SignalError, Target, address
from gateway.edge.app import create_app
from gateway.edge.load_view import DecisionLoad
from gateway.flags import FlagStore, reason_word
from gateway.metrics import GatewayMetrics
from gateway.policy.guard import GuardSpec
from gateway.policy.loader import parse_policy
from gateway.settings import Settings
from gateway.upstream.runtime import Runtime
from tests.integration.gateway.conftest import ADMIN_TOKEN, policy_dict
from tests.integration.guard.servers import FakePrometheus, TricklingMetrics
from tests.unit.guard.conftest import FakeClock

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def strict_json(text: str) -> Any:
    """JSON as the standard defines it: NaN and Infinity are not numbers there."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in a JSON answer")
    return json.loads(text, parse_constant=refuse)


def good_vectors(instance: str) -> dict[str, list[tuple[dict[str, str], str]]]:
    at = {"instance": instance}
    return {
        "num_drafts_total": [(at, "100")],
        "num_draft_tokens_total": [(at, "300")],
        "num_accepted_tokens_total": [(at, "200")],
        # Rates of different series are not taken at the same instants: a position's
        # count can come out a little above the drafts'.
        "accepted_tokens_per_pos": [({**at, "position": "0"}, "102.1"), ({**at, "position": "1"}, "100"),
                                    ({**at, "position": "2"}, "0")],
        "num_requests_running": [(at, "5")],
        "num_requests_waiting": [(at, "2")],
    }


@pytest.mark.slow  # seconds of wall time: it runs in `make test`, not `make check`
def test_nan_inf_and_empty_vectors_through_the_gateway(fakes, tmp_path):
    spec_fake, std_fake = fakes
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["guard"] = {"source": "prometheus", "interval_s": 0.1, "window": "1m",
                       "speculative": {"min_draft_tokens": 10}}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    with FakePrometheus() as prometheus:
        prometheus.answers = good_vectors(address(spec_fake.url))
        app = create_app(Settings(policy=path, admin_token=ADMIN_TOKEN, prometheus_url=prometheus.url))
        server = BackgroundServer(app, lifespan="on").start()
        load = DecisionLoad(app.state.runtime)  # what routing reads

        def after_two_more_checks() -> httpx.Response:
            """/admin/guard once the guard has read the current answers (or the first failing answer)."""
            response = httpx.get(server.url + "/admin/guard", headers=AUTH, timeout=5)
            wanted = response.json()["checks"] + 2
            while response.status_code == 200 and response.json()["checks"] < wanted:
                time.sleep(0.05)
                response = httpx.get(server.url + "/admin/guard", headers=AUTH, timeout=5)
            return response

        try:
            status = strict_json(after_two_more_checks().text)
            signals = status["pools"]["speculative"]["signals"]
            assert status["up"] is True and signals["acceptance_rate"] == pytest.approx(2 / 3)
            assert signals["per_position"] == [1.0, 1.0, 0.0], "clamped to [0, 1]"
            assert load()["speculative"] == 7

            for name in ("num_requests_running", "num_requests_waiting"):
                prometheus.answers[name] = []  # the backends stopped exporting load
            status = strict_json(after_two_more_checks().text)
            assert status["pools"]["speculative"]["signals"]["running"] is None
            assert load()["speculative"] == 0, "an empty vector clears the load, it does not freeze it"

            for name, vector in prometheus.answers.items():
                value = "NaN" if name == "num_accepted_tokens_total" else "+Inf"
                prometheus.answers[name] = [(labels, value) for labels, _ in vector]
            prometheus.answers["num_requests_running"] = [({"instance": address(spec_fake.url)}, "-Inf")]
            response = after_two_more_checks()
            assert response.status_code == 200, response.text
            status = strict_json(response.text)
            signals = status["pools"]["speculative"]["signals"]
            assert status["up"] is True, "numbers that are not numbers are missing data, not an outage"
            assert signals["acceptance_rate"] is None and signals["running"] is None
            assert status["pools"]["speculative"]["verdict"] == "hold"
            assert load()["speculative"] == 0
            flags = httpx.get(server.url + "/admin/flags", headers=AUTH, timeout=5)
            assert flags.status_code == 200 and strict_json(flags.text)["speculative"]["enabled"] is True
        finally:
            server.stop(graceful=True)


def test_custom_queries_that_answer_inf_or_out_of_range(fakes):
    spec_fake, _ = fakes
    target = Target("speculative", "vllm", (spec_fake.url,))
    spec = GuardSpec(source="prometheus", queries={"accept_rate": "custom_accept($selector)",
                                                   "running": "custom_running($selector)",
                                                   "draft_tokens": "custom_volume($selector)"})

    async def read(source: PrometheusSource):
        return (await source.read([target], spec))["speculative"]

    async def scenario() -> list[Any]:
        source = PrometheusSource(prometheus.url)
        try:
            prometheus.answers = {"custom_accept": [({}, "1.25")], "custom_running": [({}, "+Inf")],
                                  "custom_volume": [({}, "NaN")]}
            first = await read(source)
            prometheus.answers = {"custom_accept": [({}, "+Inf")], "custom_running": [({}, "3")]}
            return [first, await read(source)]
        finally:
            await source.aclose()

    with FakePrometheus() as prometheus:
        first, second = asyncio.run(scenario())
    assert (first.acceptance_rate, first.running, first.volume_tokens) == (1.0, None, 0.0)
    assert (second.acceptance_rate, second.running) == (None, 3)


def test_every_query_of_one_read_is_evaluated_at_one_instant(fakes):
    """Accepted over drafted tokens compares two increases: taken at two instants a
    scrape apart, their windows differ and the ratio drifts (1.02 at one position)."""
    spec_fake, std_fake = fakes
    targets = [Target("speculative", "vllm", (spec_fake.url,)), Target("standard", "vllm", (std_fake.url,))]
    instants = iter([1700000000.0, 1700000015.5])

    async def two_reads(url: str) -> int:
        source = PrometheusSource(url, clock=lambda: next(instants))
        try:
            await source.read(targets, GuardSpec(source="prometheus", queries={"running": "custom($selector)"}))
            first = len(prometheus.times)
            await source.read(targets, GuardSpec(source="prometheus"))
            return first
        finally:
            await source.aclose()

    with FakePrometheus() as prometheus:
        first = asyncio.run(two_reads(prometheus.url))
    assert 0 < first < len(prometheus.times)
    assert set(prometheus.times[:first]) == {"1700000000.000"}
    assert set(prometheus.times[first:]) == {"1700000015.500"}


@pytest.mark.parametrize("body", [
    b'[1, 2]',
    b'{"status": "success"}',
    b'{"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "abc"]}]}}',
    b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}',
    b'{"status": "success", "data": {"resultType": "vector", "result": 7}}',
    b'{"status": "success", "data": {"resultType": "scalar", "result": []}}',
], ids=["list", "no-data", "not-a-number", "no-value", "result-not-a-list", "empty-scalar"])
def test_a_malformed_prometheus_answer_is_a_read_failure(body):
    target = Target("speculative", "vllm", ("http://127.0.0.1:9",))

    async def read(url: str) -> None:
        source = PrometheusSource(url)
        try:
            await source.read([target], GuardSpec(source="prometheus"))
        finally:
            await source.aclose()

    with FakePrometheus() as prometheus:
        prometheus.body = body
        with pytest.raises(SignalError, match="malformed|not an object"):
            asyncio.run(read(prometheus.url))


def test_a_trickling_metrics_endpoint_makes_the_source_stale_not_stuck():
    with TricklingMetrics() as spec_backend, TricklingMetrics() as std_backend:
        policy = policy_dict([spec_backend.url], [std_backend.url])
        policy["guard"] = {"source": "scrape", "interval_s": 1, "window": "1m", "stale_after_s": 30}
        runtime = Runtime(parse_policy(yaml.safe_dump(policy), "trickle.yaml"))
        clock = FakeClock()
        flags = FlagStore(["speculative"], clock=clock)
        source = ScrapeSource(timeout_s=0.5)
        guard = Guard(runtime, flags, GatewayMetrics(), {"scrape": source}, clock=clock)

        async def two_checks() -> None:
            try:
                await guard.check()
                assert guard.up is False and flags.get("speculative").guard_enabled, "fail static at first"
                clock.advance(31)
                await guard.check()
            finally:
                await source.aclose()

        asyncio.run(two_checks())
        assert "no complete answer within 0.5 s" in (guard.last_error or "")
        flag = flags.get("speculative")
        assert not flag.guard_enabled and reason_word(flag.reason) == "stale"
        assert guard.status()["pools"]["speculative"]["verdict"] == "stale"
        assert spec_backend.hung_up.wait(30), "the guard hung up on the trickle"
        assert not spec_backend.finished.is_set()
