"""`specgate explain` names the endpoint of the chosen pool and why: with no
history, the rendezvous choice every gateway makes for a new prompt."""

from __future__ import annotations

import json

import yaml

from specgate.cli import main

POLICY = {
    "version": 1,
    "pools": {"standard": {"kind": "standard", "endpoints": [{"url": f"http://10.0.0.{i}:8000"} for i in range(3)]},
              "single": {"kind": "standard", "endpoints": [{"url": "http://10.0.1.1:8000"}]}},
    "rules": [{"name": "all", "route": "standard"}],
    "guard": {"enabled": False},
}


def explain(tmp_path, capsys, body: dict, *options: str, policy: dict = POLICY) -> dict:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    (tmp_path / "request.json").write_text(json.dumps(body))
    assert main(["explain", "--policy", str(tmp_path / "policy.yaml"), *options, str(tmp_path / "request.json")]) == 0
    return json.loads(capsys.readouterr().out)["endpoint"]


def test_explain_shows_the_rendezvous_endpoint_of_a_new_prompt(tmp_path, capsys):
    body = {"model": "m", "messages": [{"role": "system", "content": "s" * 600}, {"role": "user", "content": "hi"}]}
    first = explain(tmp_path, capsys, body)
    assert first["balance"] == "prefix" and first["reason"] == "hash"
    assert (first["matched_blocks"], first["prompt_blocks"], first["load"], first["bound"]) == (0, 4, 0, 1)
    assert first["session"] is None
    assert explain(tmp_path, capsys, body) == first, "the same prompt, the same endpoint"
    with_session = explain(tmp_path, capsys, body, "--session", "user-42")
    assert with_session["session"] == "mapped"


def test_a_single_endpoint_pool_uses_least_outstanding(tmp_path, capsys):
    policy = {**POLICY, "rules": [{"name": "all", "route": "single"}]}
    answer = explain(tmp_path, capsys, {"prompt": "hello"}, "--endpoint", "completions", policy=policy)
    assert (answer["balance"], answer["reason"], answer["endpoint"]) == ("least_outstanding", "only",
                                                                        "http://10.0.1.1:8000")
