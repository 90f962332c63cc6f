"""Client API keys, upstream keys, and what never reaches the logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.fakes.process import free_port

from .conftest import policy_dict

ROOT = Path(__file__).resolve().parents[3]
GREEDY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0, "max_tokens": 200}


@pytest.fixture
def keyed_gateway(start_gateway, spec_fake, std_fake, monkeypatch):
    monkeypatch.setenv("SPEC_POOL_KEY", "upstream-secret-spec")
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["pools"]["speculative"]["api_key"] = "os.environ/SPEC_POOL_KEY"
    return start_gateway(policy, api_keys="alpha-key,beta-key:standard")


def post(gateway, key: str | None, body=GREEDY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers)


def test_requests_without_a_valid_key_get_401(keyed_gateway):
    for key in (None, "wrong-key", ""):
        response = post(keyed_gateway, key)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
    assert httpx.get(keyed_gateway.base_url + "/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_gateway.base_url, api_key="nope", max_retries=0).models.list()


def test_client_key_is_stripped_and_the_pool_key_sent(keyed_gateway, spec_fake, std_fake):
    client = openai.OpenAI(base_url=keyed_gateway.base_url, api_key="alpha-key", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(**GREEDY)
    assert raw.headers["x-specgate-pool"] == "speculative"
    assert spec_fake.completion_requests()[-1].headers["authorization"] == "Bearer upstream-secret-spec"
    hot = client.chat.completions.with_raw_response.create(**{**GREEDY, "temperature": 1.5})
    assert hot.headers["x-specgate-pool"] == "standard"
    assert "authorization" not in std_fake.completion_requests()[-1].headers


def test_keys_limited_to_pools(keyed_gateway, spec_fake):
    before = len(spec_fake.completion_requests())
    response = post(keyed_gateway, "beta-key")  # would go to speculative; beta may only use standard
    assert response.status_code == 200
    assert response.headers["x-specgate-pool"] == "standard"
    assert len(spec_fake.completion_requests()) == before


def test_keys_from_a_file(start_gateway, spec_fake, std_fake, tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump([{"key": "file-key", "pools": ["speculative"]}]))
    gw = start_gateway(policy_dict([spec_fake.url], [std_fake.url]), api_keys_file=keys)
    assert post(gw, "file-key").headers["x-specgate-pool"] == "speculative"
    assert post(gw, "alpha-key").status_code == 401


@pytest.mark.slow
def test_logs_never_hold_prompts_completions_or_secrets(tmp_path, spec_fake, std_fake):
    prompt, completion = "PROMPT-CANARY-7731 tell me", "COMPLETION-CANARY-5519 done"
    secrets = ["ADMIN-CANARY-TOKEN", "CLIENT-CANARY-KEY", "UPSTREAM-CANARY-KEY"]
    spec_fake.script(text=completion, chunks=3)
    std_fake.script(text=completion, chunks=3)
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["pools"]["speculative"]["api_key"] = "os.environ/CANARY_POOL_KEY"
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    port = free_port()
    env = {**os.environ, "SPECGATE_ADMIN_TOKEN": secrets[0], "SPECGATE_API_KEYS": secrets[1],
           "CANARY_POOL_KEY": secrets[2], "SPECGATE_LOG_LEVEL": "debug"}
    proc = subprocess.Popen([sys.executable, "-m", "specgate.cli", "serve", "--policy", str(path),
                             "--port", str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=url + "/v1", api_key=secrets[1], max_retries=0)
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 200}
        assert client.chat.completions.create(**body).choices[0].message.content == completion
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(**body, stream=True) if c.choices)
        assert streamed == completion
        client.chat.completions.create(**{**body, "temperature": 1.7})
        httpx.post(url + "/v1/chat/completions", content=b"{broken " + prompt.encode(),
                   headers={"authorization": f"Bearer {secrets[1]}"})
        httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer wrong"})
        admin = {"authorization": f"Bearer {secrets[0]}"}
        assert httpx.post(url + "/admin/explain", json=body, headers=admin).status_code == 200
        assert httpx.get(url + "/admin/flags", headers={"authorization": "Bearer wrong"}).status_code == 403
    finally:
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=20)
    logs = stdout + stderr
    events = [json.loads(line).get("event") for line in logs.splitlines() if line.startswith("{")]
    assert "request" in events  # the run did log
    for canary in ["PROMPT-CANARY", "COMPLETION-CANARY", *secrets]:
        assert canary not in logs, canary
