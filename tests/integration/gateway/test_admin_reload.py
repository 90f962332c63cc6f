"""Admin API, policy hot reload, and `specgate explain`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import ADMIN_TOKEN, policy_dict

ROOT = Path(__file__).resolve().parents[3]
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
GREEDY_LONG = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 200}


def pool_of(gateway, body=GREEDY_LONG) -> str:
    return httpx.post(gateway.base_url + "/chat/completions", json=body).headers["x-specgate-pool"]


def wait_for(predicate, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_admin_requires_the_token(gateway):
    assert httpx.get(gateway.url + "/admin/flags").status_code == 403
    wrong = httpx.get(gateway.url + "/admin/flags", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 403 and wrong.json()["error"]["type"] == "permission_error"
    assert httpx.get(gateway.url + "/admin/flags", headers=AUTH).status_code == 200


def test_admin_disabled_without_a_token(start_gateway, spec_fake, std_fake):
    gw = start_gateway(policy_dict([spec_fake.url], [std_fake.url]), admin_token=None)
    response = httpx.get(gw.url + "/admin/flags", headers=AUTH)
    assert response.status_code == 403
    assert "SPECGATE_ADMIN_TOKEN" in response.json()["error"]["message"]


def test_explain_answers_the_decision_without_sending_anything(gateway, spec_fake, std_fake):
    before = len(spec_fake.completion_requests()) + len(std_fake.completion_requests())
    decision = httpx.post(gateway.url + "/admin/explain", headers=AUTH,
                          json={**GREEDY_LONG, "temperature": 1.4}).json()
    assert set(decision) >= {"pool", "rule", "reason", "features", "flags"}
    assert (decision["pool"], decision["rule"]) == ("standard", "hot-sampling")
    assert decision["features"]["temperature"] == 1.4
    assert decision["flags"]["speculative"]["mode"] == "auto"
    assert len(spec_fake.completion_requests()) + len(std_fake.completion_requests()) == before


def test_manual_flag_modes(gateway):
    url = gateway.url + "/admin/flags/speculative"
    assert httpx.put(url, headers=AUTH, json={"mode": "force_off"}).status_code == 200
    assert {pool_of(gateway) for _ in range(30)} == {"standard"}  # not even probes
    sent = httpx.post(gateway.base_url + "/chat/completions", json=GREEDY_LONG)
    assert sent.headers["x-specgate-reason"] == "fallback:flag"  # the cause, not a capacity problem
    flags = httpx.get(gateway.url + "/admin/flags", headers=AUTH).json()
    assert flags["speculative"]["mode"] == "force_off" and flags["speculative"]["enabled"] is False
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'specgate_speculative_enabled{pool="speculative"} 0.0' in metrics
    assert 'specgate_flag_flips_total{pool="speculative",reason="admin"} 1.0' in metrics
    httpx.put(url, headers=AUTH, json={"mode": "auto"})
    assert pool_of(gateway) == "speculative"
    bad = httpx.put(url, headers=AUTH, json={"mode": "sometimes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "mode"
    assert httpx.put(gateway.url + "/admin/flags/ghost", headers=AUTH, json={"mode": "auto"}).status_code == 404


def test_hot_reload_on_file_change_and_rejection_keeps_the_old_policy(gateway, spec_fake, std_fake):
    assert pool_of(gateway) == "speculative"
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["rules"].insert(0, {"name": "everything-standard", "route": "standard"})
    gateway.write_policy(policy)
    assert wait_for(lambda: pool_of(gateway) == "standard")

    broken = dict(policy, rules=[{"name": "x", "route": "nowhere"}])
    gateway.write_policy(broken)
    assert wait_for(lambda: 'specgate_policy_reloads_total{result="rejected"}' in
                    httpx.get(gateway.url + "/metrics").text)
    assert pool_of(gateway) == "standard"  # the previous policy still serves
    state = httpx.get(gateway.url + "/admin/policy", headers=AUTH).json()
    assert "unknown pool 'nowhere'" in state["last_reload_error"]

    reload = httpx.post(gateway.url + "/admin/policy/reload", headers=AUTH)
    assert reload.status_code == 400
    assert reload.json()["error"]["code"] == "policy_invalid"
    assert "policy.yaml:" in reload.json()["error"]["message"]

    gateway.write_policy(policy_dict([spec_fake.url], [std_fake.url]))
    reload = httpx.post(gateway.url + "/admin/policy/reload", headers=AUTH)
    assert reload.status_code == 200 and reload.json()["status"] == "applied"
    assert pool_of(gateway) == "speculative"


@pytest.mark.slow
def test_explain_command(tmp_path):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"messages": [{"role": "user", "content": "```py\nprint(1)\n```"}],
                                   "temperature": 0, "max_tokens": 300, "stream": True}))
    cli = [sys.executable, "-m", "specgate.cli", "explain", "--policy", str(ROOT / "policies" / "default.yaml")]
    calm = json.loads(subprocess.run([*cli, str(request)], capture_output=True, text=True, check=True).stdout)
    busy = json.loads(subprocess.run([*cli, str(request), "--load", "speculative=100", "--seed", "1"],
                                     capture_output=True, text=True, check=True).stdout)
    assert (calm["pool"], calm["rule"], calm["features"]["domain"]) == ("speculative", "default", "code")
    # no busy threshold any more: the priors' speculative TPOT passes the standard one's past load 64
    assert (busy["pool"], busy["rule"], busy["fastest"]["preferred"]) == ("standard", "default", "standard")
    assert [c["pool"] for c in calm["fastest"]["candidates"]] == ["speculative", "standard"]
    assert all(c["samples"] == 0 for c in calm["fastest"]["candidates"]), "nothing measured: the priors"


@pytest.mark.slow
def test_sighup_reloads_a_running_gateway(tmp_path, spec_fake, std_fake):
    import yaml

    from tests.fakes.process import free_port

    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy_dict([spec_fake.url], [std_fake.url])))
    port = free_port()
    env = {**os.environ, "SPECGATE_POLICY_WATCH_INTERVAL_S": "3600"}  # only SIGHUP may reload
    proc = subprocess.Popen([sys.executable, "-m", "specgate.cli", "serve", "--policy", str(path),
                             "--port", str(port)], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: _ready(url), timeout=20)
        policy = policy_dict([spec_fake.url], [std_fake.url])
        policy["rules"].insert(0, {"name": "all-standard", "route": "standard"})
        path.write_text(yaml.safe_dump(policy))
        proc.send_signal(signal.SIGHUP)
        body = {**GREEDY_LONG}
        assert wait_for(lambda: httpx.post(url + "/v1/chat/completions", json=body)
                        .headers["x-specgate-pool"] == "standard")
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after a clean shutdown
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(line["event"] == "policy_applied" for line in lines)
    requests = [line for line in lines if line["event"] == "request"]
    assert requests and set(requests[0]) >= {"request_id", "pool", "rule", "endpoint", "status", "ttfb",
                                             "duration"}


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("path", ["/admin/explain"])
def test_admin_explain_rejects_bad_bodies(gateway, path):
    response = httpx.post(gateway.url + path, headers=AUTH, content=b"{oops")
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
