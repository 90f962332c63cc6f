"""Even streams through a running gateway: a speculative pool sends 4 tokens
per event; with its pool's pacing on, the official client gets one event per
token and the same text; with pacing off (the default) the events come as the
pool sent them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.fakes.vllm import FakeVllm
from tests.integration.gateway.conftest import Gateway, policy_dict

CHUNKS, TOKENS = 5, 4  # five events of four tokens each: a speculative pool's steps
TEXT = "the quick brown fox jumps over the lazy dog and runs far away into the dark green wood"


@pytest.fixture
def spec_fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="upstream-spec", kind="speculative") as fake:
        fake.script(text=TEXT, chunks=CHUNKS, delay=0.01, tokens=TOKENS)
        yield fake


def paced_policy(spec_fake: FakeVllm, std_fake: FakeVllm, enabled: bool) -> dict[str, Any]:
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["pools"]["speculative"]["pacing"] = {"enabled": enabled, "max_delay_ms": 100}
    return policy


def stream(gateway: Gateway, **options: Any) -> list[Any]:
    """The chunks of a streamed chat answer, as the official client parses them."""
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        chunks = client.chat.completions.create(model="upstream-spec", max_tokens=64, stream=True,
                                                messages=[{"role": "user", "content": "hello"}], **options)
        with chunks:
            return list(chunks)


def texts(chunks: list[Any]) -> list[str]:
    return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]


def test_paced_stream_gives_one_event_per_token_and_the_same_text(start_gateway, spec_fake, std_fake):
    unpaced = texts(stream(start_gateway(paced_policy(spec_fake, std_fake, enabled=False))))
    assert len(unpaced) == CHUNKS, "pacing off: the pool's events as it sent them"
    assert "continuous_usage_stats" not in spec_fake.completion_requests()[-1].body["stream_options"]

    chunks = stream(start_gateway(paced_policy(spec_fake, std_fake, enabled=True)))
    paced = texts(chunks)
    assert len(paced) == CHUNKS * TOKENS
    assert "".join(paced) == "".join(unpaced) == TEXT
    assert spec_fake.completion_requests()[-1].body["stream_options"] == {
        "include_usage": True, "continuous_usage_stats": True}, "the pool is asked for each event's count"
    assert all(c.usage is None for c in chunks), "the count the client did not ask for is taken out"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert {c.id for c in chunks} == {chunks[0].id}


def test_a_client_that_asked_for_usage_gets_it_with_pacing(start_gateway, spec_fake, std_fake):
    gateway = start_gateway(paced_policy(spec_fake, std_fake, enabled=True))
    chunks = stream(gateway, stream_options={"include_usage": True})
    assert len(texts(chunks)) == CHUNKS * TOKENS
    assert [c.usage for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == CHUNKS * TOKENS

    counted = stream(gateway, stream_options={"include_usage": True, "continuous_usage_stats": True})
    running = [c.usage.completion_tokens for c in counted if c.choices and c.choices[0].delta.content]
    assert running == list(range(1, CHUNKS * TOKENS + 1)), "a running count the client asked for, per piece"


def test_a_standard_pool_without_pacing_is_relayed_as_before(start_gateway, spec_fake, std_fake):
    std_fake.script(text=TEXT, chunks=CHUNKS, delay=0.01, tokens=TOKENS)
    gateway = start_gateway(paced_policy(spec_fake, std_fake, enabled=True))
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        chunks = client.chat.completions.create(model="m", max_tokens=64, stream=True, temperature=1.5,
                                                messages=[{"role": "user", "content": "hello"}])
        with chunks:
            assert len(texts(list(chunks))) == CHUNKS  # hot sampling goes to the standard pool: not paced
    assert "continuous_usage_stats" not in std_fake.completion_requests()[-1].body["stream_options"]


def test_a_client_that_leaves_a_paced_stream_cancels_the_upstream_request(start_gateway, spec_fake, std_fake):
    gateway = start_gateway(paced_policy(spec_fake, std_fake, enabled=True))
    hold = spec_fake.hold()  # the pool pauses after its first event: the pacer's read-ahead waits on it
    try:
        with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
            chunks = client.chat.completions.create(model="m", max_tokens=64, stream=True,
                                                    messages=[{"role": "user", "content": "hello"}])
            with chunks:
                first = next(c for c in chunks if c.choices and c.choices[0].delta.content)
        assert first.choices[0].delta.content
        assert spec_fake.wait_disconnect(5), "the upstream request ended with the client"
        assert spec_fake.disconnects[-1].chunks_sent == 1
    finally:
        hold.set()
