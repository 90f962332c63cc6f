"""Every answer measured in output tokens, through a running gateway: a
speculative pool sends 4 tokens per event; the gateway asks it for the usage
chunk the client did not ask for and hides it again, byte for byte."""

from __future__ import annotations

import queue
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.upstream.meter import Measurement
from tests.fakes.vllm import FakeVllm
from tests.integration.gateway.conftest import policy_dict

CHUNKS, TOKENS = 5, 4  # five events of four tokens each: a speculative pool's steps
CREATED = re.compile(rb'"created":[0-9]+')  # the second the answer was made: differs between two requests


@pytest.fixture
def spec_fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="upstream-spec", kind="speculative") as fake:
        fake.script(text="one two three four five", chunks=CHUNKS, delay=0.01, tokens=TOKENS)
        yield fake



def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def raw_stream(base_url: str, endpoint: str, **options: Any) -> bytes:
    """The bytes of a streamed answer as the official client receives them."""
    with client(base_url) as openai_client:
        api = openai_client.chat.completions if endpoint == "chat" else openai_client.completions
        prompt: dict[str, Any] = ({"messages": [{"role": "user", "content": "hello"}]} if endpoint == "chat"
                                  else {"prompt": "hello"})
        with api.with_streaming_response.create(
                model="upstream-spec", max_tokens=64, stream=True, extra_headers={"x-request-id": "same-id"},
                **prompt, **options) as response:
            return CREATED.sub(b'"created":0', b"".join(response.iter_bytes()))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_client_that_did_not_ask_for_usage_gets_the_stream_it_got_before(gateway, spec_fake, measured, endpoint):
    direct = raw_stream(spec_fake.url + "/v1", endpoint)
    assert b'"usage"' not in direct and b'"system_fingerprint"' in direct
    assert raw_stream(gateway.base_url, endpoint) == direct
    sent = spec_fake.completion_requests()[-1].body
    assert sent["stream_options"] == {"include_usage": True}, "the gateway asked for the usage chunk"
    assert measured.get().tokens == CHUNKS * TOKENS


def test_a_client_that_asked_for_usage_gets_its_usage_chunk(gateway, spec_fake, measured):
    usage = {"stream_options": {"include_usage": True}}
    direct = raw_stream(spec_fake.url + "/v1", "chat", **usage)
    assert raw_stream(gateway.base_url, "chat", **usage) == direct
    with client(gateway.base_url) as openai_client:
        chunks = list(openai_client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=64, stream=True, **usage))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == CHUNKS * TOKENS
    assert [m.tokens for m in (measured.get(), measured.get())] == [CHUNKS * TOKENS] * 2


def test_the_recorded_time_per_token_is_per_token_not_per_event(gateway, measured):
    with client(gateway.base_url) as openai_client:
        stream = openai_client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "def f(): pass"}], max_tokens=64,
            temperature=0.3, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream) == "one two three four five"
    measurement = measured.get()
    assert (measurement.pool, measurement.traffic_class, measurement.streamed) == ("speculative", "code/low", True)
    assert measurement.tokens == CHUNKS * TOKENS and measurement.load >= 0
    assert measurement.ttft_s is not None and measurement.tpot_s is not None
    # the decode time is spread over the 19 tokens after the first, not over the 4 events after the first
    assert measurement.tpot_s == pytest.approx((measurement.e2e_s - measurement.ttft_s) / (CHUNKS * TOKENS - 1))
    # The fake sleeps 10 ms before each event. The first is timed when the gateway reads it, which a
    # busy host may delay (by up to one sleep before two events share a read), so the decoding the
    # meter saw spans the last three sleeps at least (less timer granularity).
    assert measurement.tpot_s * (CHUNKS * TOKENS - 1) >= 3 * 0.01 - 0.001


def test_non_streamed_answers_are_measured_too(gateway, measured):
    with client(gateway.base_url) as openai_client:
        completion = openai_client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=64, temperature=0)
    assert completion.usage is not None and completion.usage.completion_tokens == CHUNKS * TOKENS
    measurement = measured.get()
    assert (measurement.pool, measurement.traffic_class) == ("speculative", "chat/greedy")
    assert (measurement.tokens, measurement.streamed, measurement.ttft_s, measurement.tpot_s) == (
        CHUNKS * TOKENS, False, None, None)
    assert measurement.e2e_s > 0


def test_per_class_timing_is_fed_the_per_token_time(start_gateway, spec_fake, std_fake):
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["guard"] = {"enabled": True, "interval_s": 60, "classes": {"enabled": True, "min_samples": 1}}
    gateway = start_gateway(policy)
    found: queue.Queue[Measurement] = queue.Queue()
    gateway.app.state.proxy.recorder.sinks.append(found.put)
    with client(gateway.base_url) as openai_client:
        list(openai_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}],
                                                   max_tokens=64, temperature=0.3, stream=True))
    measurement = found.get()  # the per-class sink comes first: it has its sample by now
    assert gateway.app.state.proxy.class_latency.samples("chat/low", "speculative", 60) == [measurement.tpot_s]


def test_a_stream_cut_before_the_usage_chunk_still_gives_the_client_its_last_chunk(gateway, spec_fake):
    """The last choice chunk waits for the usage chunk; when the pool breaks in
    between, it goes out before the error event."""
    spec_fake.cut_stream(after_events=1 + CHUNKS)  # the role chunk and every choice chunk, then the connection drops
    with client(gateway.base_url) as openai_client, openai_client.chat.completions.with_streaming_response.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=64, stream=True) as response:
        events = b"".join(response.iter_bytes()).split(b"\n\n")
    assert b'"finish_reason":"stop"' in events[CHUNKS] and b'"error"' in events[CHUNKS + 1]
    assert events[CHUNKS + 2:] == [b""], "nothing after the error event"
