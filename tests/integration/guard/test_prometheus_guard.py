"""The guard end to end: fake vLLM backends -> a real Prometheus -> the gateway's
guard -> where the official openai client's requests are served."""

from __future__ import annotations

import httpx
import openai
import pytest
import yaml

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.edge.load_view import DecisionLoad
from gateway.settings import Settings
from tests.fakes.waiting import wait_until
from tests.integration.gateway.conftest import ADMIN_TOKEN, policy_dict
from tests.integration.guard.conftest import Feeder

pytestmark = pytest.mark.slow  # a real Prometheus server

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def guard_policy(spec_url: str, std_url: str) -> dict:
    policy = policy_dict([spec_url], [std_url])
    policy["guard"] = {
        "source": "prometheus", "interval_s": 1, "window": "6s",
        "speculative": {"accept_rate": {"trip_below": 0.4, "recover_above": 0.55}, "trip_after": 2,
                        "recover_after": 2, "min_hold_s": 2, "min_draft_tokens": 50, "probe_fraction": 0},
    }
    return policy


def served_by(client: openai.OpenAI) -> str:
    raw = client.chat.completions.with_raw_response.create(
        model="any", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=64, temperature=0.5)
    raw.parse()
    return raw.headers["x-specgate-pool"]


def assert_read_through_prometheus(status: dict, spec_fake) -> None:
    """What the guard read of the speculative pool: acceptance 2/3 over 3 draft positions,
    5 running and 2 waiting, and latency level with the standard pool."""
    assert status["up"] is True and status["source"] == "prometheus"
    pool = status["pools"]["speculative"]
    assert pool["enough_data"] and pool["signals"]["acceptance_rate"] == pytest.approx(2 / 3, abs=0.02)
    assert pool["signals"]["mean_accepted_length"] == pytest.approx(3.0, abs=0.05)
    # A position's increase over the drafts' increase: both queries are evaluated
    # at one instant (windows a scrape apart gave 1.021), and clamped to [0, 1].
    per_position = pool["signals"]["per_position"]
    assert all(0.0 <= p <= 1.0 for p in per_position), per_position
    assert per_position == pytest.approx([1.0, 1.0, 0.0], abs=0.02)
    assert pool["signals"]["running"] == 5 and pool["signals"]["waiting"] == 2
    assert pool["latency"]["baseline"] == "standard"
    assert pool["latency"]["regression_pct"] == pytest.approx(0, abs=10)
    assert f"127.0.0.1:{spec_fake.port}" in pool["signals"]["endpoints"]


def test_guard_trips_recovers_and_fails_static_on_a_real_prometheus(fakes, prometheus, tmp_path):
    spec_fake, std_fake = fakes
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(guard_policy(spec_fake.url, std_fake.url)))
    app = create_app(Settings(policy=path, admin_token=ADMIN_TOKEN, prometheus_url=prometheus.url))
    server = BackgroundServer(app, lifespan="on").start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)

    def guard() -> dict:
        return httpx.get(server.url + "/admin/guard", headers=AUTH, timeout=5).json()

    def acceptance() -> float | None:
        signals = guard()["pools"]["speculative"]["signals"]
        return signals and signals["acceptance_rate"]

    spec_fake.set_load(running=5, waiting=2)
    try:
        with Feeder(spec_fake, acceptance=0.8) as feeder, Feeder(std_fake):  # same latencies: no regression
            # 3 draft positions: 0.8 rounds to 2 accepted tokens per draft, acceptance 2/3
            wait_until(lambda: (acceptance() or 0) > 0.6, "acceptance 2/3 read through Prometheus")
            wait_until(lambda: guard()["pools"]["speculative"]["latency"]["regression_pct"] is not None,
                       "p95 latency of both pools")
            assert_read_through_prometheus(guard(), spec_fake)
            assert DecisionLoad(app.state.runtime)()["speculative"] == 7
            assert served_by(client) == "speculative"

            feeder.acceptance = 0.2  # 1 of 3 drafted tokens: acceptance 1/3, under 0.4
            wait_until(lambda: served_by(client) == "standard", "speculative routing turned off")
            flag = httpx.get(server.url + "/admin/flags", headers=AUTH).json()["speculative"]
            assert flag["guard_enabled"] is False and flag["reason"].startswith("low_acceptance")
            assert all(served_by(client) == "standard" for _ in range(5))
            metrics = httpx.get(server.url + "/metrics").text
            assert 'specgate_flag_flips_total{pool="speculative",reason="low_acceptance"} 1.0' in metrics
            assert 'specgate_speculative_enabled{pool="speculative"} 0.0' in metrics

            feeder.acceptance = 0.8
            wait_until(lambda: served_by(client) == "speculative", "speculative routing back on")
            assert guard()["pools"]["speculative"]["reason"].startswith("recovered")

            prometheus.kill()
            wait_until(lambda: "specgate_guard_up 0.0" in httpx.get(server.url + "/metrics").text,
                       "guard_up 0 after Prometheus died")
            status = guard()
            assert status["up"] is False and "unreachable" in status["error"]
            assert status["pools"]["speculative"]["enabled"] is True, "fail static: the flags stay"
            assert served_by(client) == "speculative"
    finally:
        server.stop(graceful=True)
