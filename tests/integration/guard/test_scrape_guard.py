"""The embedded default's guard: no Prometheus, the gateway scrapes the backends
itself, and live traffic (with its probe share while off) feeds the counters."""

from __future__ import annotations

import collections

import httpx
import openai
import pytest
import yaml

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.settings import Settings
from tests.fakes.waiting import wait_until
from tests.integration.gateway.conftest import ADMIN_TOKEN, policy_dict

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.mark.slow  # seconds of wall time: it runs in `make test`, not `make check`
def test_scrape_guard_trips_on_traffic_and_probes_bring_it_back(fakes, tmp_path):
    spec_fake, std_fake = fakes
    spec_fake.spec_acceptance = 0.2  # each served token: one draft of 3 tokens, 1 accepted
    spec_fake.script(chunks=20)
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["guard"] = {"source": "scrape", "interval_s": 0.5, "window": "3s",
                       "speculative": {"trip_after": 2, "recover_after": 2, "min_hold_s": 1,
                                       "min_draft_tokens": 30, "probe_fraction": 0.3}}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    server = BackgroundServer(create_app(Settings(policy=path, admin_token=ADMIN_TOKEN)), lifespan="on").start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    served: collections.Counter[str] = collections.Counter()

    def serve() -> str:
        raw = client.completions.with_raw_response.create(model="m", prompt="Once upon a time",
                                                          max_tokens=64, temperature=0.5)
        raw.parse()
        pool = raw.headers["x-specgate-pool"]
        served[pool] += 1
        return pool

    def enabled() -> bool:
        return httpx.get(server.url + "/admin/flags", headers=AUTH).json()["speculative"]["enabled"]

    try:
        wait_until(lambda: serve() and not enabled(), "the guard trips on live traffic")
        guard = httpx.get(server.url + "/admin/guard", headers=AUTH).json()
        assert guard["source"] == "scrape" and guard["up"] is True
        assert guard["pools"]["speculative"]["reason"].startswith("low_acceptance")
        served.clear()
        for _ in range(40):
            serve()
        assert served["standard"] > 0 and served["speculative"] > 0, f"probes still go: {dict(served)}"

        spec_fake.spec_acceptance = 0.8  # 2 of 3 accepted, seen through the probes only
        wait_until(lambda: serve() and enabled(), "probes show recovery and speculation comes back")
        assert serve() == "speculative"
    finally:
        server.stop(graceful=True)
