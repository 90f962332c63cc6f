"""A gateway started with relative paths keeps reading and writing the files they named
at start, after its working directory changes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import yaml

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.settings import Settings
from tests.integration.gateway.conftest import ADMIN_TOKEN, START_GUARD_S, policy_dict

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
HANG_GUARD_S = 60.0


def test_reload_and_flag_writes_use_the_start_directorys_files(spec_fake, std_fake, tmp_path, monkeypatch, capfd):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    policy = policy_dict([spec_fake.url], [std_fake.url])
    decoy = dict(policy, rules=[{"name": "decoy", "route": "standard"}])
    (elsewhere / "policy.yaml").write_text(yaml.safe_dump(decoy))
    (elsewhere / "flags.json").write_text("{}")
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump([{"key": "home-key"}]))
    monkeypatch.chdir(tmp_path)
    settings = Settings(policy=Path("policy.yaml"), flags_file=Path("flags.json"), api_keys_file=Path("keys.yaml"),
                        admin_token=ADMIN_TOKEN, policy_watch_interval_s=3600)
    monkeypatch.chdir(elsewhere)  # the same relative names now find the decoys
    server = BackgroundServer(create_app(settings), lifespan="on").start(timeout=START_GUARD_S)
    try:
        started = capfd.readouterr().out  # the start-up line names the files by their absolute paths
        assert "files" in started and f"policy={tmp_path / 'policy.yaml'}" in started, started
        assert f"flags_file={tmp_path / 'flags.json'}" in started
        assert f"api_keys_file={tmp_path / 'keys.yaml'}" in started
        check_files(server.url, tmp_path, elsewhere, policy)
    finally:
        server.stop(graceful=True)


def check_files(url: str, home: Path, elsewhere: Path, policy: dict) -> None:
    answer = httpx.post(url + "/v1/chat/completions", headers={"authorization": "Bearer home-key"},
                        json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200  # the keys of the start directory

    (home / "policy.yaml").write_text(yaml.safe_dump(dict(policy, rules=[{"name": "home", "route": "standard"}])))
    reload = httpx.post(url + "/admin/policy/reload", headers=AUTH)
    assert reload.status_code == 200 and reload.json()["source"] == str(home / "policy.yaml")
    rules = httpx.get(url + "/admin/policy", headers=AUTH).json()["policy"]["rules"]
    assert [rule["name"] for rule in rules] == ["home"]

    put = httpx.put(url + "/admin/flags/speculative", headers=AUTH, json={"mode": "force_off"})
    assert put.status_code == 200
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard: the flag file is written off the event loop
    while mode_in(home / "flags.json") != "force_off":
        assert time.monotonic() < deadline, "the flag file was never written"
        time.sleep(0.05)
    assert (elsewhere / "flags.json").read_text() == "{}"


def mode_in(flags_file: Path) -> str | None:
    """The speculative pool's mode in the flag file (written whole, by rename), None before it is."""
    if not flags_file.exists():
        return None
    return json.loads(flags_file.read_text()).get("speculative", {}).get("mode")
