"""End to end on real vLLM: two vLLM CPU servers (speculative, drafting with the
shipped EAGLE-3 head, and standard) serving the packaged SmolLM2-135M-Instruct, and the gateway in front,
started with `specgate up`'s own start-up code. The official openai client
talks to the gateway. Slow (vLLM loads for a minute or two): one stack per module.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from backends.model import prepare
from gateway.settings import default_policy_path
from specgate.replicas import fleet, vllm_backend
from specgate.up import Stack, gateway_service
from tests.fakes.process import free_port

pytestmark = pytest.mark.e2e

ADMIN = "e2e-admin-token"
PROMPT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]


def e2e_policy(spec_port: int, std_port: int) -> dict:
    policy = yaml.safe_load(default_policy_path().read_text())
    policy["pools"]["speculative"]["endpoints"] = [{"url": f"http://127.0.0.1:{spec_port}"}]
    policy["pools"]["standard"]["endpoints"] = [{"url": f"http://127.0.0.1:{std_port}"}]
    policy["overrides"] = {"route_header": True}  # to pin each greedy stream to the pool it compares
    # a quick guard, so it has a window of data after a few requests
    policy["guard"].update(interval_s=1, window="30s")
    policy["guard"]["speculative"].update(min_draft_tokens=10, trip_after=1000)
    agents = {"endpoint": {"in": ["messages", "responses"]}}  # chat keeps the default policy's rules
    policy["rules"] = [{"name": "agents-hot", "when": {"all": [agents, {"temperature": {"gt": 1.0}}]},
                        "route": "standard"},
                       {"name": "agents", "when": agents, "route": "speculative"}, *policy["rules"]]
    return policy


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    model_dir = prepare()  # cached outside the checkout, reused between runs
    work: Path = tmp_path_factory.mktemp("e2e")
    ports = (free_port(), free_port())
    policy = work / "policy.yaml"
    policy.write_text(yaml.safe_dump(e2e_policy(*ports)))
    gateway = gateway_service(policy, free_port(), work)
    gateway.env["SPECGATE_ADMIN_TOKEN"] = ADMIN
    backends = [vllm_backend(replica, model_dir, work) for replica in fleet(default_policy_path(), ports)]
    running = Stack(backends, gateway)  # the default's fleet, as `up` starts it
    try:
        running.start(timeout_s=600, progress=print)
    except BaseException:
        running.stop()
        for service in running.services:
            if service.log.exists():
                print(service.name, service.log.read_text()[-3000:])
        raise
    yield running, ports
    running.stop()


def base_url(stack) -> str:
    running, _ = stack
    return running.gateway.health_url.removesuffix("/readyz")


def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url(stack) + "/v1", api_key="unused", max_retries=0, timeout=120)


def stream_text(stack, pool: str) -> tuple[str, str]:
    """(pool, text) of a streamed greedy chat completion through the gateway, pinned
    to `pool` by the route header: the default policy's choice is a random draw."""
    with client(stack).chat.completions.with_streaming_response.create(
            model="smollm2", messages=PROMPT, temperature=0, max_tokens=128, stream=True,
            extra_headers={"x-specgate-route": pool}) as response:
        pool = response.headers["x-specgate-pool"]
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    return pool, text


def spec_draft_tokens(ports) -> float:
    text = httpx.get(f"http://127.0.0.1:{ports[0]}/metrics", timeout=10).text  # classic text format
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:spec_decode_num_draft_tokens_total{"))


def test_greedy_stream_is_speculative_and_equals_the_standard_pool(stack):
    from transformers import AutoTokenizer

    _, ports = stack
    before = spec_draft_tokens(ports)
    spec_pool, spec_text = stream_text(stack, "speculative")
    std_pool, std_text = stream_text(stack, "standard")
    assert (spec_pool, std_pool) == ("speculative", "standard")
    assert spec_text.strip()
    tokenizer = AutoTokenizer.from_pretrained(prepare())
    spec_ids, std_ids = tokenizer.encode(spec_text), tokenizer.encode(std_text)
    shorter = min(len(spec_ids), len(std_ids))
    same = next((i for i, (a, b) in enumerate(zip(spec_ids, std_ids, strict=False)) if a != b), shorter)
    print(f"greedy texts: {len(spec_ids)} and {len(std_ids)} tokens, identical for the first {same}; "
          f"whole texts equal: {spec_text == std_text}")
    assert same >= 32, f"speculative and standard greedy outputs diverge at token {same}"
    assert spec_draft_tokens(ports) > before  # the speculative server really drafted


def test_the_fastest_route_learns_from_a_real_stream(stack):
    """The default policy routes by predicted speed: a streamed answer from a real
    vLLM server is measured and lands in the latency model of the pool that served it."""
    with client(stack).chat.completions.with_streaming_response.create(
            model="smollm2", messages=PROMPT, temperature=1.5, max_tokens=32, stream=True) as raw:
        served = raw.headers["x-specgate-pool"]
        assert raw.headers["x-specgate-rule"] == "default"
        assert "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    assert served in ("speculative", "standard")

    def learned() -> list[dict]:
        state = httpx.get(base_url(stack) + "/admin/latency", headers={"authorization": f"Bearer {ADMIN}"},
                          timeout=10).json()
        return [pair for pair in state["pairs"] if pair["pool"] == served]

    pairs = learned()
    for _ in range(100):  # the record is written when the exchange finishes, just after the last event
        if pairs:
            break
        time.sleep(0.05)
        pairs = learned()
    assert pairs, f"no latency sample for the pool that served ({served})"


def test_guard_reads_a_real_acceptance_rate(stack):
    deadline = time.monotonic() + 90
    rate = None
    while time.monotonic() < deadline and rate is None:
        stream_text(stack, "speculative")  # keep speculative traffic flowing
        state = httpx.get(base_url(stack) + "/admin/guard", headers={"authorization": f"Bearer {ADMIN}"},
                          timeout=10).json()
        signals = state["pools"]["speculative"]["signals"]
        rate = signals and signals.get("acceptance_rate")
    assert rate is not None, state
    assert 0.0 < rate < 1.0
    print(f"guard (scrape) acceptance rate: {rate:.3f}, mean accepted length "
          f"{state['pools']['speculative']['signals']['mean_accepted_length']}")


@pytest.mark.parametrize(("temperature", "pool"), [(0, "speculative"), (1.5, "standard")])
@pytest.mark.parametrize("stream", [False, True])
def test_messages_go_through_the_decision_on_real_vllm(stack, temperature, pool, stream):
    with anthropic.Anthropic(base_url=base_url(stack), api_key="unused", max_retries=0, timeout=120) as claude:
        served, text, tokens = ask_messages(claude, temperature, stream)
    assert served == pool and text.strip() and tokens > 0


def ask_messages(claude: anthropic.Anthropic, temperature: float, stream: bool) -> tuple[str, str, int]:
    """(pool, text, output tokens) of one Messages request through the gateway."""
    options = {"model": "smollm2", "max_tokens": 48, "system": "Answer briefly.",
               "messages": [{"role": "user", "content": "Why is the sky blue?"}],
               "extra_body": {"temperature": temperature}}
    if stream:
        with claude.messages.with_streaming_response.create(stream=True, **options) as response:
            served = response.headers["x-specgate-pool"]
            events = list(response.parse())
        assert events[0].type == "message_start" and events[-1].type == "message_stop"
        text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
        tokens = [e.usage.output_tokens for e in events if e.type == "message_delta"][-1]
    else:
        raw = claude.messages.with_raw_response.create(**options)
        served, message = raw.headers["x-specgate-pool"], raw.parse()
        text, tokens = message.content[0].text, message.usage.output_tokens
    return served, text, tokens


@pytest.mark.parametrize(("temperature", "pool"), [(0, "speculative"), (1.5, "standard")])
@pytest.mark.parametrize("stream", [False, True])
def test_responses_go_through_the_decision_on_real_vllm(stack, temperature, pool, stream):
    with client(stack) as openai_client:
        served, text, usage = ask_responses(openai_client, temperature, stream)
    assert served == pool and text.strip() and usage is not None and usage.output_tokens > 0


def ask_responses(openai_client: openai.OpenAI, temperature: float, stream: bool) -> tuple[str, str, Any]:
    """(pool, text, usage) of one Responses request through the gateway."""
    options = {"model": "smollm2", "input": "Why is the sky blue?", "instructions": "Answer briefly.",
               "temperature": temperature, "max_output_tokens": 48}
    if stream:
        with openai_client.responses.with_streaming_response.create(stream=True, **options) as response:
            served = response.headers["x-specgate-pool"]
            events = list(response.parse())
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        usage = events[-1].response.usage
    else:
        raw = openai_client.responses.with_raw_response.create(**options)
        served, answer = raw.headers["x-specgate-pool"], raw.parse()
        text, usage = answer.output_text, answer.usage
    return served, text, usage


def test_bad_messages_are_answered_in_anthropics_envelope_on_real_vllm(stack):
    answer = httpx.post(base_url(stack) + "/v1/messages", timeout=30,
                        json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 400 and answer.json()["type"] == "error"
    assert answer.json()["error"]["type"] == "invalid_request_error"
