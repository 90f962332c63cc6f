"""`specgate check` and `specgate explain` on the shipped default policy: it
is valid, routes with `route: fastest`, and its pool limits give the queue
the bounds its comment states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.policy.loader import load_policy
from gateway.upstream.pools import queue_limits
from specgate.cli import main

DEFAULT = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Summarize this text"}],
           "temperature": 0.2, "max_tokens": 200, "stream": True}


def test_check_accepts_the_default_policy(capsys):
    assert main(["check", str(DEFAULT)]) == 0
    assert capsys.readouterr().out.strip().endswith("ok (2 pools, 1 rules)")


@pytest.mark.parametrize("load, pool", [
    ([], "speculative"),  # idle: the priors put speculative TPOT at half the standard one's
    (["--load", "speculative=70"], "standard"),  # past the priors' crossover, and costly to those running
])
def test_explain_shows_the_fastest_choice_and_its_candidates(tmp_path, capsys, load, pool):
    request = tmp_path / "request.json"
    request.write_text(json.dumps(REQUEST))
    assert main(["explain", "--policy", str(DEFAULT), *load, str(request)]) == 0
    decision = json.loads(capsys.readouterr().out)
    found = decision["fastest"]
    assert (decision["pool"], decision["rule"], found["preferred"], decision["explored"]) == (pool, "default", pool,
                                                                                             False)
    assert decision["chain"] == [pool, *({"speculative", "standard"} - {pool})]
    assert (found["traffic_class"], found["expected_tokens"]) == ("summarization/low", 200)
    for candidate in found["candidates"]:
        assert candidate["e2e_s"] == pytest.approx(candidate["ttft_s"] + 200 * candidate["tpot_s"])
        assert candidate["sampled_cost_s"] == candidate["cost_s"], "no --seed: the mean decides"


def test_the_default_pools_fill_vllms_cpu_batch_and_queue_the_rest():
    policy = load_policy(DEFAULT)
    for spec in policy.spec.pools.values():
        assert spec.max_in_flight == 128  # vLLM's --max-num-seqs for its CPU OpenAI server
        assert queue_limits(spec) == (512, 30.0)  # max(4 x 128, 256) waiters, min(first_byte_s, 30 s)
