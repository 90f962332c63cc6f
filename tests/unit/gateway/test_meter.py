"""Counting output tokens: the usage block, the usage chunk the gateway asks
for and hides again, and the measurement of one answer."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.serving.answers import SSE_DONE, ResponseBuilder, sse
from backends.serving.generation import Endpoint
from gateway.upstream.drafting import Drafting
from gateway.upstream.meter import Measurement, TokenMeter
from gateway.upstream.usage import FINISH, UsageTap, completion_tokens, done_events, finish_at

FINGERPRINT = "vllm-0.32.0-0123abcd"


def stream_events(endpoint: Endpoint, include_usage: bool,
                  pieces: tuple[str, ...] = ("Hel", "lo ", "there")) -> list[bytes]:
    """The events vLLM sends for `pieces` (4 tokens each), with or without the usage chunk."""
    builder = ResponseBuilder(endpoint, "m", "req-1", created=1700000000, system_fingerprint=FINGERPRINT)
    events = []
    opening = builder.first_chunk()
    if opening is not None:
        events.append(sse(opening))
    for index, piece in enumerate(pieces):
        finish = "stop" if index == len(pieces) - 1 else None
        events.append(sse(builder.chunk(piece, finish, last=not include_usage)))
    if include_usage:
        events.append(sse(builder.usage_chunk(7, 4 * len(pieces))))
    return [*events, SSE_DONE]


def through(tap: UsageTap, runs: list[bytes]) -> bytes:
    return b"".join(tap.feed(run) for run in runs) + tap.flush()


def test_completion_tokens_reads_the_last_usage_block_only():
    assert completion_tokens(b'{"usage":{"prompt_tokens":3,"completion_tokens":11}}') == 11
    assert completion_tokens(b'{"a":{"completion_tokens":1},"usage":{"completion_tokens" : 12}}') == 12
    # generated text that spells the key has its quotes escaped: not a count
    assert completion_tokens(b'{"text":"say \\"completion_tokens\\": 99"}') is None
    assert completion_tokens(b'{"completion_tokens_details":null}') is None


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_hidden_usage_chunk_leaves_the_stream_as_it_was_without_it(endpoint):
    """vLLM moves system_fingerprint from the last choice chunk to the usage
    chunk when usage is asked for: the tap puts it back and drops the chunk."""
    asked, plain = stream_events(endpoint, True), stream_events(endpoint, False)
    assert asked[:-3] == plain[:-2] and asked[-3] != plain[-2], "only the last choice chunk differs"
    for runs in (asked, [b"".join(asked)], [b"".join(asked[:-2]), b"".join(asked[-2:])]):
        tap = UsageTap(hidden=True)
        assert through(tap, runs) == b"".join(plain)
        assert tap.tokens() == 12


def test_the_last_choice_chunk_waits_only_for_the_usage_chunk():
    asked = stream_events("chat", True)
    tap = UsageTap(hidden=True)
    assert tap.feed(b"".join(asked[:-3])) == b"".join(asked[:-3]), "content passes at once"
    assert tap.feed(asked[-3]) == b""
    released = tap.feed(asked[-2])
    assert released == stream_events("chat", False)[-2]
    assert tap.feed(asked[-1]) == SSE_DONE and tap.flush() == b""


def test_a_stream_that_breaks_after_the_last_choice_chunk_still_gets_it():
    asked = stream_events("chat", True)
    tap = UsageTap(hidden=True)
    tap.feed(b"".join(asked[:-2]))
    assert tap.flush() == asked[-3] and tap.tokens() is None


def test_a_pool_that_ignores_include_usage_is_passed_through():
    plain = stream_events("chat", False)
    tap = UsageTap(hidden=True)
    assert through(tap, plain) == b"".join(plain) and tap.tokens() is None


def test_usage_null_marks_are_cut_when_hidden():
    """Servers that follow OpenAI mark every chunk with "usage":null once usage is asked for."""
    marked = [b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":null}\n\n',
              b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
              b'"system_fingerprint":"fp","usage":null}\n\n',
              b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":9},'
              b'"system_fingerprint":"fp"}\n\n', SSE_DONE]
    tap = UsageTap(hidden=True)
    assert through(tap, marked) == (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
        b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"system_fingerprint":"fp"}\n\n'
        + SSE_DONE)
    assert tap.tokens() == 9


def test_usage_the_client_asked_for_is_read_and_passed_on():
    asked = stream_events("chat", True)
    tap = UsageTap(hidden=False)
    assert through(tap, asked) == b"".join(asked) and tap.tokens() == 12


def test_a_streamed_measurement_is_per_token():
    """Four events 0.5 s apart, 4 tokens each: 1.5 s of decoding over the 15 tokens after the first."""
    meter = TokenMeter(httpx.ByteStream(b""))
    meter.events, meter.first, meter.last = 4, 10.5, 12.0
    measurement = Measurement.of_stream("speculative", "code/low", 3, meter, started=10.0, tokens=16)
    assert measurement == Measurement("speculative", "code/low", 3, e2e_s=2.0, tokens=16, streamed=True,
                                      ttft_s=0.5, tpot_s=pytest.approx(1.5 / 15),
                                      drafting=Drafting(per_step=8.0))  # 16 tokens in 2 events with content
    one = Measurement.of_stream("standard", None, 0, meter, started=10.0, tokens=1)
    assert one.tpot_s is None, "one token has no time per token"


DONE_EVENTS = re.compile(rb"data:[ \t]*\[DONE\]")  # the search `done_events` stands for


@pytest.mark.parametrize("data", [
    b"", b"data: [DONE]\n\n", b"data:[DONE]\n\n", b"data: \t [DONE]\r\n\r\n", b"[DONE]", b"x[DONE]",
    b'data: {"content": "[DONE]"}\n\n', b"data: [DONE]\n\ndata: [DONE]\n\n", b"data:x[DONE]", b"ata: [DONE]",
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n', b"data:data: [DONE][DONE]",
])
def test_done_events_counts_what_the_regex_finds(data):
    assert done_events(data) == len(DONE_EVENTS.findall(data))


# the pieces a finish_reason key is made of and mistaken for, and what separates them
FINISH_PIECES = st.sampled_from([b'"finish_reason"', b'_reason"', b'"finish', b'"stop_reason"', b'"finish__reason"',
                                 b":", b" ", b"\t", b"\r\n", b'"', b"null", b"x", b"_", b"data: ", b"\n\n"])


@given(st.lists(FINISH_PIECES, max_size=24).map(b"".join))
def test_finish_at_is_where_the_regex_first_matches(data):
    found = FINISH.search(data)
    assert finish_at(data) == (-1 if found is None else found.start())


@pytest.mark.parametrize("data", [
    b'"finish_reason":"stop"', b'"finish_reason" : \t"length"', b'"finish_reason":null', b'_reason":"x"',
    b'"stop_reason":"</s>","finish_reason":"stop"', b'"stop_reason":"</s>"', b'finish_reason":"stop"',
    b'{"index":0,"stop_reason":"</s>"}', b'{"index":0,"stop_reason":"</s>","finish_reason":"stop"}',
])
def test_finish_at_cases(data):
    found = FINISH.search(data)
    assert finish_at(data) == (-1 if found is None else found.start())


def test_a_stream_without_usage_counts_its_events_less_done():
    chunk = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n' * 3 + b"data:[DONE]\n\n"
    meter = TokenMeter(httpx.ByteStream(chunk))

    async def read() -> list[bytes]:
        return [piece async for piece in meter]

    assert asyncio.run(read()) == [chunk]
    assert meter.events == 4 and meter.counted() is None and meter.tokens() == 3
