"""The serving app's answers have the shape of a live vLLM 0.32 server's:
same keys in the same order, same nulls, same scalar types, same number of
SSE events (vllm_live_samples.json was captured from one, max_tokens 3)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from backends.serving import Delta, GenerationRequest, VllmMetrics, create_openai_app
from backends.serving.server import BackgroundServer

LIVE = json.loads((Path(__file__).parent / "vllm_live_samples.json").read_text())
CHAT = {"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
TEXT = {"model": "M", "prompt": "hi", "max_tokens": 3}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
CONTINUOUS = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


class ThreeTokens:
    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        for index, piece in enumerate(("one", " two", " three")):
            yield Delta(piece, finish_reason="length" if index == 2 else None)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = create_openai_app(ThreeTokens(), VllmMetrics(CollectorRegistry(), "M"), "M")
    with BackgroundServer(app) as server:
        yield server.url


def shape(value: Any) -> Any:
    """Keys, order and nulls kept; scalars replaced by their type."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(item) for item in value]
    return None if value is None else type(value).__name__


def stream_events(response: httpx.Response) -> list[dict]:
    raw = response.text
    assert raw.endswith("data: [DONE]\n\n")
    frames = raw.split("\n\n")[:-2]
    assert all(frame.startswith("data: {") for frame in frames)
    return [json.loads(frame.removeprefix("data: ")) for frame in frames]


@pytest.mark.parametrize(
    ("sample", "path", "body"),
    [
        ("chat", "/v1/chat/completions", CHAT),
        ("cmpl", "/v1/completions", TEXT),
        ("model_404", "/v1/chat/completions", {**CHAT, "model": "X"}),
    ],
)
def test_whole_responses(url: str, sample: str, path: str, body: dict) -> None:
    ours = httpx.post(url + path, json=body).json()
    assert shape(ours) == shape(LIVE[sample])
    if sample == "model_404":
        assert ours == LIVE[sample]


@pytest.mark.parametrize(
    ("sample", "path", "body"),
    [
        ("chat_stream", "/v1/chat/completions", {**CHAT, "stream": True}),
        ("chat_stream_usage", "/v1/chat/completions", {**CHAT, **USAGE}),
        ("chat_stream_continuous", "/v1/chat/completions", {**CHAT, **CONTINUOUS}),
        ("cmpl_stream", "/v1/completions", {**TEXT, "stream": True}),
        ("cmpl_stream_usage", "/v1/completions", {**TEXT, **USAGE}),
        ("cmpl_stream_continuous", "/v1/completions", {**TEXT, **CONTINUOUS}),
    ],
)
def test_streams(url: str, sample: str, path: str, body: dict) -> None:
    ours = stream_events(httpx.post(url + path, json=body))
    assert [shape(event) for event in ours] == [shape(event) for event in LIVE[sample]]
    assert len({event["id"] for event in ours}) == 1


def test_fingerprint_and_unknown_routes_look_like_vllm(url: str) -> None:
    fingerprint = httpx.post(url + "/v1/chat/completions", json=CHAT).json()["system_fingerprint"]
    assert re.fullmatch(r"vllm-0\.32\.0-[0-9a-f]{8}", fingerprint)
    assert re.fullmatch(r"vllm-0\.32\.0-[0-9a-f]{8}", LIVE["chat"]["system_fingerprint"])
    assert httpx.get(url + "/nope").json() == LIVE["unknown_route"]
