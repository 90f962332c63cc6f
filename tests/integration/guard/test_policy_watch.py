"""A running gateway's policy watcher and reload endpoint, fed a file the YAML
parser cannot follow: counted, answered as a rejected policy, and the watch goes on."""

from __future__ import annotations

import httpx
import yaml

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.settings import Settings
from tests.fakes.waiting import wait_until
from tests.integration.gateway.conftest import ADMIN_TOKEN, policy_dict

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
NESTED = "version: 1\npools: " + "[" * 5000 + "]" * 5000 + "\n"


def reloads(server: BackgroundServer, result: str) -> float:
    for line in httpx.get(server.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(f'specgate_policy_reloads_total{{result="{result}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_nested_policy_file_is_counted_and_the_watcher_goes_on(fakes, tmp_path):
    spec_fake, std_fake = fakes
    policy = policy_dict([spec_fake.url], [std_fake.url])
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    app = create_app(Settings(policy=path, admin_token=ADMIN_TOKEN, policy_watch_interval_s=0.05))
    server = BackgroundServer(app, lifespan="on").start()
    try:
        path.write_text(NESTED)
        wait_until(lambda: reloads(server, "rejected") >= 1, "the watcher counts the broken file")
        answer = httpx.post(server.url + "/admin/policy/reload", headers=AUTH, timeout=5)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "policy_invalid" and "nested deeper than" in error["message"]
        current = httpx.get(server.url + "/admin/policy", headers=AUTH, timeout=5).json()
        assert [r["name"] for r in current["policy"]["rules"]] == [r["name"] for r in policy["rules"]]
        assert "nested deeper than" in current["last_reload_error"]

        policy["rules"].insert(0, {"name": "added", "when": {"max_tokens": {"lt": 2}}, "route": "standard"})
        path.write_text(yaml.safe_dump(policy))
        wait_until(lambda: httpx.get(server.url + "/admin/policy", headers=AUTH, timeout=5)
                   .json()["policy"]["rules"][0]["name"] == "added", "the next good file applies")
        assert reloads(server, "applied") >= 1
    finally:
        server.stop(graceful=True)
