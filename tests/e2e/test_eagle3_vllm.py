"""End to end on real vLLM: the shipped EAGLE-3 head drafts in vLLM's CPU build.

One vLLM CPU server with the `speculative-eagle3-local` launch profile (the
head shipped for the packaged SmolLM2-135M-Instruct), started by `specgate
up`'s own code (float32). The official openai client asks it a few held-out
prompts, greedy: each answer must be the target's plain greedy answer,
computed in-process with transformers (float32; one vLLM start instead of
two), and vLLM's speculative counters must show drafts, accepted tokens and
accepted first positions.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from backends.model import prepare
from specgate.replicas import vllm_backends
from specgate.up import SERVED_MODEL, stop_all, wait_healthy
from tests.fakes.process import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "speculative-eagle3-local"
MAX_TOKENS = 48
PROMPTS = 4  # the first held-out prompts: code, code, code, chat
SPEC = "vllm:spec_decode_"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    work: Path = tmp_path_factory.mktemp("eagle3")
    service = vllm_backends(prepare(), work, (port, free_port()), speculative_profile=PROFILE)[0]
    service.start()
    try:
        wait_healthy([service], 900, print)
    except BaseException:
        stop_all([service], progress=print)
        print(service.log.read_text()[-3000:] if service.log.exists() else "no log")
        raise
    yield f"http://127.0.0.1:{port}"
    stop_all([service], progress=print)


def spec_counters(url: str) -> dict[str, float]:
    """vLLM's speculative counters, summed over labels except `position`."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if not line.startswith(SPEC):
            continue
        name, _, value = line.rpartition(" ")
        key = name.split("{", 1)[0].removeprefix(SPEC)
        if key.endswith("_created"):  # the counters' creation times
            continue
        if 'position="' in name:
            key += "@" + name.split('position="', 1)[1].split('"', 1)[0]
        found[key] = found.get(key, 0.0) + float(value)
    return found


def plain_greedy(messages: list[list[dict[str, str]]]) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepare())
    model = AutoModelForCausalLM.from_pretrained(prepare(), dtype=torch.float32)
    answers = []
    with torch.inference_mode():
        for conversation in messages:
            ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)["input_ids"]
            out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
            answers.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return answers


def test_shipped_head_drafts_in_vllm_and_greedy_output_is_plain_greedy(server):
    lines = (ROOT / "data" / "draft" / "heldout.jsonl").read_text().splitlines()
    conversations = [json.loads(line)["messages"] for line in lines[:PROMPTS]]
    before = spec_counters(server)
    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        served = [client.chat.completions.create(model=SERVED_MODEL, messages=conversation, temperature=0,
                                                 max_tokens=MAX_TOKENS).choices[0].message.content or ""
                  for conversation in conversations]
    after = spec_counters(server)
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    print("speculative counters over the prompts:", delta)
    expected = plain_greedy(conversations)
    for n, (got, want) in enumerate(zip(served, expected, strict=True)):
        assert got == want, f"prompt {n}: speculative greedy {got!r} differs from plain greedy {want!r}"
    assert delta.get("num_drafts_total", 0) > 0, delta
    assert delta.get("num_accepted_tokens_total", 0) > 0, delta
    assert delta.get("num_accepted_tokens_per_pos_total@0", 0) > 0, delta
    assert delta["num_accepted_tokens_total"] <= delta["num_draft_tokens_total"]


def test_sampled_requests_are_verified_too(server):
    """Sampled drafts go through the rejection sampler's per-token temperatures,
    which vLLM CPU loses without backends/vllm/cpu_fixes.py: then not one draft
    token is accepted and the text is unrelated to the prompt."""
    lines = (ROOT / "data" / "draft" / "heldout.jsonl").read_text().splitlines()
    conversations = [json.loads(line)["messages"] for line in lines[:PROMPTS]]
    before = spec_counters(server)
    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        for seed, conversation in enumerate(conversations):
            client.chat.completions.create(model=SERVED_MODEL, messages=conversation, temperature=0.7,
                                           seed=seed, max_tokens=MAX_TOKENS)
    after = spec_counters(server)
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    print("speculative counters over the sampled prompts:", delta)
    assert delta.get("num_draft_tokens_total", 0) > 0, delta
    assert delta.get("num_accepted_tokens_total", 0) > 0, delta
