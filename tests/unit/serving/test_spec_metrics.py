"""Per-request acceptance (`metrics.speculative_decoding`) as vLLM 0.32 run with
`--per-request-spec-decode-metrics summary` writes it, from the fake vLLM and
the simulated server. vllm_spec_metrics_samples.json was captured from a live
vLLM CPU server (docs/backends.md)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from backends.serving import GenerationRequest
from backends.serving.acceptance import AcceptanceTally
from backends.serving.server import BackgroundServer
from backends.sim.server import create_sim_app
from tests.fakes import FakeVllm

LIVE = json.loads((Path(__file__).parent / "vllm_spec_metrics_samples.json").read_text())
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def shape(value: Any) -> Any:
    """Keys, order and nulls kept; scalars replaced by their type."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(item) for item in value[:1]]
    return None if value is None else type(value).__name__


def test_the_tally_is_vllms_own_summary():
    with warnings.catch_warnings():  # importing vLLM's engine side warns about torch.jit
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    steps = [(4, 4), (4, 0), (4, 2), (2, 1), (4, 4), (0, 0)]
    ours, theirs = AcceptanceTally(4), RequestSpecDecodeMetrics.new(4)
    for drafted, accepted in steps:
        ours.observe(drafted, accepted)
        if drafted:  # vLLM observes verify steps only
            theirs.observe(drafted, accepted)
    assert ours.summary() == theirs.to_dict()
    assert AcceptanceTally(3).summary() == RequestSpecDecodeMetrics.new(3).to_dict()


def hot_is_worse(request: GenerationRequest) -> float:
    return 0.25 if (request.temperature or 0.0) > 1.0 else 0.75


@pytest.fixture
def fake():
    with FakeVllm(model="fake-model", kind="speculative", num_speculative_tokens=4, acceptance=hot_is_worse) as running:
        running.script(text="one two three four five six seven eight", chunks=8)
        yield running


def test_a_whole_answer_carries_the_metrics_where_vllm_puts_them(fake):
    body = httpx.post(f"{fake.url}/v1/chat/completions", json={**CHAT, "temperature": 0}).json()
    assert list(body)[-4:] == LIVE["chat_tail_keys"]
    assert shape(body["metrics"]) == shape(LIVE["chat_metrics"])
    spec = body["metrics"]["speculative_decoding"]
    assert spec["draft_acceptance_rate"] == 0.75 and spec["num_spec_steps"] == 8 and spec["num_spec_tokens"] == 4
    assert body["usage"]["completion_tokens"] == 8 * 4  # three accepted drafts and the target's token a step
    text = httpx.post(f"{fake.url}/v1/completions", json={"model": "fake-model", "prompt": "p"}).json()
    assert shape(text["metrics"]) == shape(LIVE["cmpl_metrics"])


def test_a_stream_carries_them_on_its_usage_chunk_only(fake):
    def events(**extra: Any) -> list[dict]:
        raw = httpx.post(f"{fake.url}/v1/chat/completions", json={**CHAT, "stream": True, **extra}).text
        return [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]

    usage = events(temperature=1.5, stream_options={"include_usage": True})
    assert ["metrics" in event for event in usage] == [False] * (len(usage) - 1) + [True]
    live = LIVE["chat_stream_usage_chunk"]
    assert shape(usage[-1]) == shape(live)
    assert usage[-1]["metrics"]["speculative_decoding"]["draft_acceptance_rate"] == 0.25
    assert not any("metrics" in event for event in events(temperature=1.5))  # no usage chunk, no metrics


def test_the_openai_client_reads_the_learned_acceptance_per_class(fake):
    with openai.OpenAI(base_url=f"{fake.url}/v1", api_key="unused", max_retries=0) as api:
        cold = api.chat.completions.create(**CHAT, temperature=0.0)
        hot = api.chat.completions.create(**CHAT, temperature=1.5)
    rates = [reply.model_extra["metrics"]["speculative_decoding"]["draft_acceptance_rate"] for reply in (cold, hot)]
    assert rates == [0.75, 0.25]


def test_a_standard_fake_and_a_fake_without_acceptance_stay_as_they_were():
    with FakeVllm(kind="standard") as standard:
        assert httpx.post(f"{standard.url}/v1/chat/completions", json=CHAT).json()["metrics"] is None
    with FakeVllm(kind="speculative") as plain:
        plain.script(text="a b c d", chunks=4, tokens=2)
        body = httpx.post(f"{plain.url}/v1/chat/completions", json=CHAT).json()
        assert body["usage"]["completion_tokens"] == 8
        spec = body["metrics"]["speculative_decoding"]
        assert spec["acceptance_histogram"] == [0, 4, 0, 0] and spec["mean_acceptance_length"] == 2.0


@pytest.mark.parametrize("kind", ["speculative", "dynamic", "standard"])
def test_the_simulated_server_reports_each_answers_acceptance(kind):
    app, engine = create_sim_app(kind, "sim", time_scale=0.001, seed=3)
    with BackgroundServer(app) as server:
        body = httpx.post(f"{server.url}/v1/chat/completions", json={
            "model": "sim", "max_tokens": 64, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a python function that adds two numbers."}]}).json()
    if kind == "standard":
        assert body["metrics"] is None
        return
    spec = body["metrics"]["speculative_decoding"]
    assert shape(body["metrics"]) == shape(LIVE["chat_metrics"])
    drafted_tokens = spec["num_spec_steps"] * engine.params.num_speculative_tokens
    assert spec["num_spec_steps"] > 0 and spec["num_draft_tokens"] == drafted_tokens
    assert 0.5 < spec["draft_acceptance_rate"] <= 1.0  # greedy code: the model's highest acceptance
    assert body["usage"]["completion_tokens"] == 64
