"""The serving app on a real loopback server: the official openai client,
raw SSE framing, load accounting, disconnects and generator failures."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry

from backends.serving import Delta, GenerationRequest, VllmMetrics, create_openai_app
from backends.serving.server import BackgroundServer

CHAT = {"model": "M", "messages": [{"role": "user", "content": "hello there"}]}


class ScriptedGenerator:
    """Yields `words` one token each; optionally queues on `gate` first, holds
    once running until `hold` is set, and reports when it was cancelled."""

    def __init__(self, words: tuple[str, ...] = ("a", "b", "c"), delay: float = 0.0) -> None:
        self.words = words
        self.delay = delay
        self.gate: threading.Event | None = None
        self.hold: threading.Event | None = None
        self.cancelled = threading.Event()
        self.fail_after: int | None = None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        try:
            while self.gate is not None and not self.gate.is_set():
                await asyncio.sleep(0.01)
            request.mark_running()
            while self.hold is not None and not self.hold.is_set():
                await asyncio.sleep(0.01)
            for index, word in enumerate(self.words):
                if self.fail_after == index:
                    raise RuntimeError("engine fell over")
                await asyncio.sleep(self.delay)
                last = index == len(self.words) - 1
                yield Delta(word, finish_reason="length" if last else None, prompt_tokens=9)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@pytest.fixture
def generator() -> ScriptedGenerator:
    return ScriptedGenerator()


@pytest.fixture
def server(generator: ScriptedGenerator) -> Iterator[BackgroundServer]:
    metrics = VllmMetrics(CollectorRegistry(), "M", num_speculative_tokens=2)
    app = create_openai_app(generator, metrics, "M", max_model_len=2048)
    with BackgroundServer(app) as running:
        yield running


def sample(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_openai_client_chat_and_completions(server: BackgroundServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    reply = client.chat.completions.create(**CHAT)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.choices[0].message.content == "abc"
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (9, 3)

    chunks = list(
        client.chat.completions.create(**CHAT, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "abc"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 12
    assert len({c.id for c in chunks}) == 1

    text = client.completions.create(model="M", prompt="x", max_tokens=3)
    assert text.object == "text_completion" and text.id.startswith("cmpl-")
    assert text.choices[0].text == "abc"
    assert [m.id for m in client.models.list()] == ["M"]


def test_raw_sse_framing_and_request_id(server: BackgroundServer) -> None:
    body = {**CHAT, "stream": True}
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers={"x-request-id": "r-42"}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert {p["id"] for p in payloads} == {"chatcmpl-r-42"}
    assert [p["choices"][0]["finish_reason"] for p in payloads] == [None, None, None, "length"]


def test_running_and_waiting_follow_the_generator(
    server: BackgroundServer, generator: ScriptedGenerator
) -> None:
    generator.gate = threading.Event()
    generator.hold = threading.Event()  # all six stay running until the test has seen them
    results: list[int] = []

    def call() -> None:
        results.append(httpx.post(f"{server.url}/v1/chat/completions", json=CHAT).status_code)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    _wait(lambda: sample(server.url, "vllm:num_requests_waiting") == 6)
    assert sample(server.url, "vllm:num_requests_running") == 0
    generator.gate.set()
    _wait(lambda: sample(server.url, "vllm:num_requests_running") == 6)
    generator.hold.set()
    for thread in threads:
        thread.join(10)
    assert results == [200] * 6
    assert sample(server.url, "vllm:num_requests_running") == 0
    assert sample(server.url, "vllm:num_requests_waiting") == 0
    assert sample(server.url, "vllm:e2e_request_latency_seconds_count") == 6
    assert sample(server.url, "vllm:generation_tokens_total") == 18


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_cancels_the_generator(
    server: BackgroundServer, generator: ScriptedGenerator, stream: bool
) -> None:
    generator.words = ("slow",) * 1000
    generator.delay = 0.05
    url = f"{server.url}/v1/chat/completions"
    with httpx.Client(timeout=0.3) as client:
        if stream:
            with client.stream("POST", url, json={**CHAT, "stream": True}) as response:
                next(response.iter_lines())  # got the first event, then hang up
        else:
            with pytest.raises(httpx.ReadTimeout):
                client.post(url, json=CHAT)
    assert generator.cancelled.wait(5)
    _wait(lambda: sample(server.url, "vllm:num_requests_running") == 0)
    aborted = 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="M"} 1.0'
    assert aborted in httpx.get(f"{server.url}/metrics").text


def test_generator_failure_becomes_an_error_envelope(
    server: BackgroundServer, generator: ScriptedGenerator
) -> None:
    generator.fail_after = 1
    response = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT)
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "engine fell over"
    streamed = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "stream": True})
    events = [e for e in streamed.text.split("\n\n") if e]
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == 500
    assert events[-1] == "data: [DONE]"


def test_bad_requests_get_envelopes(server: BackgroundServer) -> None:
    bad_json = httpx.post(f"{server.url}/v1/chat/completions", content=b"{nope")
    assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "BadRequestError"
    unknown = httpx.get(f"{server.url}/v1/unknown")  # vLLM (FastAPI) shape for routes
    assert unknown.status_code == 404 and unknown.json() == {"detail": "Not Found"}
    wrong_method = httpx.get(f"{server.url}/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.json() == {"detail": "Method Not Allowed"}
    assert httpx.get(f"{server.url}/health").status_code == 200


def _wait(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def test_background_server_lifespan_and_graceful_stop(generator: ScriptedGenerator) -> None:
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.routing import Mount

    events: list[str] = []

    @asynccontextmanager
    async def lifespan(app):
        events.append("startup")
        yield
        events.append("shutdown")

    metrics = VllmMetrics(CollectorRegistry(), "M")
    inner = create_openai_app(generator, metrics, "M")
    app = Starlette(routes=[Mount("/", inner)], lifespan=lifespan)
    generator.delay = 0.1
    server = BackgroundServer(app, lifespan="on").start()
    assert events == ["startup"]
    replies: list[int] = []
    caller = threading.Thread(
        target=lambda: replies.append(
            httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=10).status_code
        )
    )
    caller.start()
    _wait(lambda: sample(server.url, "vllm:num_requests_running") == 1)
    server.stop(graceful=True)
    caller.join(10)
    assert replies == [200] and events == ["startup", "shutdown"]


def test_metrics_negotiate_openmetrics_like_vllm(server: BackgroundServer) -> None:
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    scraped = httpx.get(f"{server.url}/metrics", headers={"accept": accept})
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert scraped.text.rstrip().endswith("# EOF")
    # As from vLLM itself with this prometheus_client: OpenMetrics samples get
    # "vllm_" names (client_python issue 1177), so a Prometheus that scrapes
    # with OpenMetrics stores vllm_* series unless its config relabels them.
    assert "# TYPE vllm:spec_decode_num_drafts counter" in scraped.text
    assert 'vllm_spec_decode_num_drafts_total{engine="0",model_name="M"} 0.0' in scraped.text
    plain = httpx.get(f"{server.url}/metrics")
    assert plain.headers["content-type"].startswith("text/plain")


def test_a_scrape_never_splits_a_speculative_step() -> None:
    """Each step drafts 3 tokens and accepts 2: every scrape must show exactly that ratio."""
    metrics = VllmMetrics(CollectorRegistry(), "M", num_speculative_tokens=3)
    done = threading.Event()

    def steps() -> None:
        while not done.is_set():
            metrics.observe_spec_decode(1, 3, 2, (1, 1, 0))

    worker = threading.Thread(target=steps)
    worker.start()
    try:
        for _ in range(300):
            text = metrics.render()[0].decode()
            draft, accepted = (
                next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))
                for name in ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")
            )
            assert 2 * draft == 3 * accepted
    finally:
        done.set()
        worker.join()
