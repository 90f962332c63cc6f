"""`/control` on a real loopback simulator: a domain's draft acceptance
collapses on request, the other domains keep theirs, bad bodies are refused."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from backends.serving.server import BackgroundServer
from backends.sim.model import acceptance, expected_acceptance_rate
from backends.sim.server import create_sim_app

LABELS = '{engine="0",model_name="sim"}'
CODE = "Fix this:\n```python\ndef f(x):\n    return x\n```"


@pytest.fixture
def server() -> Iterator[BackgroundServer]:
    app, _ = create_sim_app("speculative", "sim", time_scale=0.002, seed=3)
    running = BackgroundServer(app).start()
    yield running
    running.stop()


def counters(url: str) -> tuple[float, float]:
    """(accepted draft tokens, draft tokens) so far."""
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        for name in ("accepted_tokens", "draft_tokens"):
            prefix = f"vllm:spec_decode_num_{name}_total{LABELS} "
            if line.startswith(prefix):
                values[name] = float(line[len(prefix):])
    return values["accepted_tokens"], values["draft_tokens"]


def rate_of_one(url: str, content: str) -> float:
    """The acceptance rate of one 256-token greedy answer to `content`."""
    before = counters(url)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model="sim", messages=[{"role": "user", "content": content}],
                                   max_tokens=256, temperature=0.0)  # fmt: skip
    after = counters(url)
    return (after[0] - before[0]) / (after[1] - before[1])


def test_a_domain_collapses_and_recovers_on_request(server: BackgroundServer) -> None:
    healthy = expected_acceptance_rate(acceptance("code", 0.0), 3)
    assert rate_of_one(server.url, CODE) == pytest.approx(healthy, abs=0.1)
    answer = httpx.post(f"{server.url}/control", json={"domain_quality": {"code": 0.3}})
    assert answer.status_code == 200 and answer.json() == {"domain_quality": {"code": 0.3}}
    collapsed = expected_acceptance_rate(acceptance("code", 0.0) * 0.3, 3)
    assert rate_of_one(server.url, CODE) == pytest.approx(collapsed, abs=0.1)
    chat = expected_acceptance_rate(acceptance("chat", 0.0), 3)
    assert rate_of_one(server.url, "Tell me about rivers.") == pytest.approx(chat, abs=0.1)
    httpx.post(f"{server.url}/control", json={"domain_quality": {"code": 1.0}})
    assert rate_of_one(server.url, CODE) == pytest.approx(healthy, abs=0.1)
    assert httpx.get(f"{server.url}/control").json() == {"domain_quality": {"code": 1.0}}


@pytest.mark.parametrize("body", [b"not json", b'{"draft": 1}', b'{"domain_quality": {"code": 0}}',
                                  b'{"domain_quality": {"code": true}}', b'{"domain_quality": [1]}'])
def test_a_bad_control_body_is_refused_and_changes_nothing(server: BackgroundServer, body: bytes) -> None:
    answer = httpx.post(f"{server.url}/control", content=body)
    assert answer.status_code == 400 and "error" in answer.json()
    assert httpx.get(f"{server.url}/control").json() == {"domain_quality": {}}
