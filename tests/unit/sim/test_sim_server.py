"""The simulated pool on a real loopback server: openai client, shared batch
clock, spec-decode counters, load gauges, and the `specgate sim` command."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from backends.serving.server import BackgroundServer
from backends.sim.engine import SimEngine
from backends.sim.model import SimParams, acceptance, expected_acceptance_rate
from backends.sim.server import create_sim_app
from tests.fakes.process import free_port, spawn_module, wait_until_ok

LABELS = '{engine="0",model_name="sim"}'


@pytest.fixture
def serve() -> Iterator:
    servers: list[BackgroundServer] = []

    def start(kind: str, time_scale: float = 0.02, **params) -> tuple[BackgroundServer, SimEngine]:
        app, engine = create_sim_app(
            kind, "sim", params=dataclasses.replace(SimParams(), **params),
            time_scale=time_scale, seed=1,
        )  # fmt: skip
        server = BackgroundServer(app).start()
        servers.append(server)
        return server, engine

    yield start
    for server in servers:
        server.stop()


def metric(url: str, name: str) -> float:
    prefix = f"{name}{LABELS} "
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    raise AssertionError(f"{name} not exported")


def chat(url: str, **extra) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": extra.pop("content", "Tell me about rivers.")}]
    return client.chat.completions.create(model="sim", messages=messages, **extra)


def test_standard_pool_decodes_one_token_per_step(serve) -> None:
    server, engine = serve("standard")
    reply = chat(server.url, max_tokens=20)
    assert reply.usage.completion_tokens == 20 and reply.choices[0].finish_reason == "length"
    assert engine.steps == 20  # one prefill step, then one token per step
    assert "spec_decode" not in httpx.get(f"{server.url}/metrics").text


def test_speculative_pool_moves_the_counters(serve) -> None:
    server, engine = serve("speculative", time_scale=0.005)
    reply = chat(server.url, max_tokens=400, temperature=0.0)
    assert reply.usage.completion_tokens == 256  # the natural answer length
    assert reply.choices[0].finish_reason == "stop"
    assert engine.steps < 200  # several tokens per step
    drafts = metric(server.url, "vllm:spec_decode_num_drafts_total")
    draft_tokens = metric(server.url, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric(server.url, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts == engine.steps - 1 and draft_tokens == 3 * drafts
    expected = expected_acceptance_rate(acceptance("chat", 0.0), 3)
    assert accepted / draft_tokens == pytest.approx(expected, abs=0.1)
    text = httpx.get(f"{server.url}/metrics").text
    pos = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    ]
    assert len(pos) == 3 and pos == sorted(pos, reverse=True)
    assert sum(pos) == accepted


def test_hot_sampling_accepts_less(serve) -> None:
    rates = []
    for temperature in (0.0, 2.0):
        server, _ = serve("speculative", time_scale=0.002)
        chat(server.url, max_tokens=256, temperature=temperature)
        accepted = metric(server.url, "vllm:spec_decode_num_accepted_tokens_total")
        rates.append(accepted / metric(server.url, "vllm:spec_decode_num_draft_tokens_total"))
    assert rates[0] > rates[1]


def test_concurrent_requests_share_the_batch_clock(serve) -> None:
    server, engine = serve("standard", time_scale=1.0)  # 10 ms steps: the requests overlap
    replies: list[int] = []

    def one() -> None:
        replies.append(chat(server.url, max_tokens=15).usage.completion_tokens)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert replies == [15] * 8
    assert engine.steps < 8 * 15 / 2  # they advanced together, not one after another


def test_streaming_and_waiting_beyond_the_batch_cap(serve) -> None:
    server, _ = serve("standard", time_scale=1.0, max_num_seqs=2, output_tokens=40)
    seen_waiting = threading.Event()
    done: list[str] = []

    def one() -> None:
        stream = chat(server.url, stream=True)
        done.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(done) < 4:
        if metric(server.url, "vllm:num_requests_waiting") == 2:
            assert metric(server.url, "vllm:num_requests_running") == 2
            seen_waiting.set()
            break
        time.sleep(0.01)
    for thread in threads:
        thread.join(30)
    assert seen_waiting.is_set() and len(done) == 4 and all(done)
    assert metric(server.url, "vllm:num_requests_waiting") == 0
    assert metric(server.url, "vllm:e2e_request_latency_seconds_count") == 4


@pytest.mark.slow
def test_specgate_sim_command_serves_the_openai_api() -> None:
    port = free_port()
    process = spawn_module("specgate.cli", "sim", "--kind", "speculative", "--port", str(port),
                           "--model", "sim", "--time-scale", "0.01")  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ok(f"{url}/health", process)
        reply = chat(url, max_tokens=10, content="def f(x): return x")
        assert reply.usage.completion_tokens == 10
        assert metric(url, "vllm:spec_decode_num_drafts_total") > 0
    finally:
        process.terminate()
        process.wait(10)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status tells why
    assert process.returncode in (0, -signal.SIGTERM)
