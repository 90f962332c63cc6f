"""`specgate up` runs the policy's fleet: a policy of three pools gets three
backends, each pool pointed at its own, and a request the policy routes to the
third pool is answered by the backend `up` started for it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import yaml

from gateway.settings import default_policy_path
from tests.fakes.process import free_port
from tests.integration.up.up_process import FAKE_BACKEND, UpProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # specgate up and its backends as processes


@pytest.fixture
def up(tmp_path) -> Iterator[UpProcess]:
    data = yaml.safe_load(default_policy_path().read_text())
    data["pools"]["extra"] = {"kind": "standard", "model": "smollm2",
                              "endpoints": [{"url": "http://replica.internal:8000"}]}  # `up` points it home
    data["rules"] = [{"name": "math-to-extra", "when": {"domain": "math"}, "route": "extra",
                      "reason": "the third pool"}, *data["rules"]]
    policy = tmp_path / "three-pools.yaml"
    policy.write_text(yaml.safe_dump(data, sort_keys=False))
    process = UpProcess(tmp_path, "--cache-dir", str(tmp_path / "cache"), "--backend-command", FAKE_BACKEND,
                        backend_ports=(free_port(), free_port(), free_port()), policy=policy)
    yield process.start()
    process.kill()


def test_every_pool_of_the_policy_gets_a_backend_of_its_own(up):
    up.wait_ready(60)
    for port in up.backend_ports:
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    logs = sorted(p.name for p in (up.work / "cache" / "logs").iterdir())
    assert logs == ["backend-extra.log", "backend-speculative.log", "backend-standard.log", "gateway.log"]
    body = {"model": "smollm2", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "solve for x: 2 + 2 = x"}]}
    answer = httpx.post(up.url + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-specgate-pool"] == "extra"
    assert answer.json()["choices"][0]["message"]["content"]
