"""A policy file cannot stall serving: it is loaded in a worker thread and
bounded, and one that fails leaves the policy in force serving, with the
reload metric and the admin API saying why. File watching and
`POST /admin/policy/reload` alike. Real gateway and fake vLLM backends on 127.0.0.1."""

from __future__ import annotations

import os
import threading

import httpx
import pytest
import yaml

from tests.fakes.waiting import wait_until
from tests.unit.gateway.test_policy_bounds import alias_bomb, deep

from .conftest import ADMIN_TOKEN, policy_dict
from .test_request_path import GREEDY, post

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def reloads(url: str, result: str) -> float:
    text = httpx.get(url + "/metrics").text
    line = next((line for line in text.splitlines()
                 if line.startswith(f'specgate_policy_reloads_total{{result="{result}"}}')), None)
    return 0.0 if line is None else float(line.split()[-1])


def hostile_files(valid: str) -> dict[str, tuple[str, str]]:
    """name -> (the file's text, what the refusal says)."""
    return {
        "alias bomb": (alias_bomb(), "once its aliases are expanded"),
        "50 MB": (valid + ("# " + "x" * 1022 + "\n") * (50 * 1024), "byte limit"),
        "10k deep": (valid + deep(10_000), "nested deeper than"),
    }


@pytest.mark.parametrize("how", ["admin", "watcher"])
def test_hostile_files_are_refused_and_the_old_policy_keeps_serving(start_gateway, spec_fake, std_fake, how):
    policy = policy_dict([spec_fake.url], [std_fake.url])
    gw = start_gateway(policy, policy_watch_interval_s=3600 if how == "admin" else 0.2)
    valid = yaml.safe_dump(policy, sort_keys=False)
    for name, (text, says) in hostile_files(valid).items():
        before = reloads(gw.url, "rejected")
        tmp = gw.policy_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(gw.policy_path)  # whole: the watcher never reads half a file
        if how == "admin":
            answer = httpx.post(gw.url + "/admin/policy/reload", headers=AUTH, timeout=60)
            assert answer.status_code == 400, name
            assert answer.json()["error"]["code"] == "policy_invalid" and says in answer.json()["error"]["message"]
        wait_until(lambda before=before: reloads(gw.url, "rejected") == before + 1, f"{name} rejected")
        state = httpx.get(gw.url + "/admin/policy", headers=AUTH).json()
        assert says in state["last_reload_error"], (name, state["last_reload_error"])
        served = post(gw, GREEDY)
        assert (served.status_code, served.headers["x-specgate-pool"]) == (200, "speculative"), name
    assert reloads(gw.url, "applied") == 0


def test_serving_goes_on_while_a_policy_is_being_loaded(start_gateway, spec_fake, std_fake):
    """The file is a pipe that the test holds open: the load (one read) waits on
    it in its thread, and meanwhile the gateway answers health checks and requests."""
    policy = policy_dict([spec_fake.url], [std_fake.url])
    gw = start_gateway(policy, policy_watch_interval_s=3600)
    os.unlink(gw.policy_path)
    os.mkfifo(gw.policy_path)
    answers: list[httpx.Response] = []
    reloading = threading.Thread(target=lambda: answers.append(
        httpx.post(gw.url + "/admin/policy/reload", headers=AUTH, timeout=60)))
    reloading.start()
    policy["rules"].insert(0, {"name": "everything-standard", "route": "standard"})
    text = yaml.safe_dump(policy, sort_keys=False).encode()
    with open(gw.policy_path, "wb") as pipe:  # opens once the reload reads: the reload is under way
        assert httpx.get(gw.url + "/healthz").status_code == 200
        served = post(gw, GREEDY)
        assert (served.status_code, served.headers["x-specgate-pool"]) == (200, "speculative")
        pipe.write(text)
    reloading.join()
    assert answers[0].status_code == 200, answers[0].text
    assert post(gw, GREEDY).headers["x-specgate-pool"] == "standard"
