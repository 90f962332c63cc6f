"""Pacing a stream's bursts: one event per token, evenly spaced within the
bound, in order, the end never held, and nothing sent once the client is gone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from backends.serving.answers import SSE_DONE, ResponseBuilder, sse, usage
from backends.serving.generation import Endpoint
from gateway.policy.loader import parse_policy
from gateway.upstream.pacing import Pacer, split_text
from gateway.upstream.pools import Pool
from gateway.upstream.usage import ask_token_counts, client_counts

PROMPT = 5


def builder(endpoint: Endpoint = "chat") -> ResponseBuilder:
    return ResponseBuilder(endpoint, "m", "req-1", created=1700000000)


def content(text: str, counted: int, finish: str | None = None, endpoint: Endpoint = "chat") -> bytes:
    """A content chunk with the running count a pool sends under continuous_usage_stats."""
    return sse(builder(endpoint).chunk(text, finish, usage(PROMPT, counted)))


def role() -> bytes:
    opening = builder().first_chunk(usage(PROMPT, 0))
    assert opening is not None
    return sse(opening)


def chunks(data: bytes) -> list[dict[str, Any]]:
    """The JSON chunks of a run of events ([DONE] left out)."""
    events = [e for e in data.split(b"\n\n") if e and e != b"data: [DONE]"]
    return [json.loads(e.removeprefix(b"data: ")) for e in events]


def text_of(data: bytes) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks(data) if c["choices"])


def dues(pacer: Pacer) -> list[float]:
    return [round(due, 6) for due, _ in pacer.held]


def test_a_burst_of_k_tokens_becomes_k_events_spaced_at_the_streams_rate():
    pacer = Pacer(max_delay_s=0.15)
    pacer.feed(role() + content("abcd", 4), now=0.0)  # the first burst: no rate known yet, all at once
    assert dues(pacer) == [0.0] * 5
    pacer.release(None)
    pacer.feed(content("Hello world!", 8), now=0.04)  # 4 tokens in 40 ms: 10 ms a token
    assert dues(pacer) == [0.04, 0.05, 0.06, 0.07]
    out = pacer.release(None)
    pieces = chunks(out)
    assert [c["choices"][0]["delta"]["content"] for c in pieces] == ["Hel", "lo ", "wor", "ld!"]
    assert {(c["id"], c["created"], c["model"], c["object"]) for c in pieces} == {
        ("chatcmpl-req-1", 1700000000, "m", "chat.completion.chunk")}
    assert all("usage" not in c for c in pieces)  # the client did not ask for the running count


def test_pieces_never_wait_past_the_bound():
    pacer = Pacer(max_delay_s=0.03)
    pacer.feed(content("ab", 2), now=0.0)
    pacer.feed(content("cd", 4), now=0.02)  # 10 ms a token
    pacer.release(None)
    pacer.feed(content("abcdefgh", 12), now=0.04)  # 8 tokens at ~5 ms would take 37 ms: squeezed into 30
    held = dues(pacer)
    assert held[0] == 0.04 and held[-1] == pytest.approx(0.04 + 0.03)
    gaps = [b - a for a, b in zip(held, held[1:], strict=False)]
    assert gaps == pytest.approx([0.03 / 7] * 7, abs=1e-5)  # evenly spaced within the bound


def test_the_rate_is_the_average_gap_over_the_average_tokens():
    pacer = Pacer(max_delay_s=0.15)
    counted = 0
    for step in range(40):  # a step every 20 ms, of 1 and 4 tokens in turn: 8 ms a token on average
        counted += 1 if step % 2 else 4
        pacer.feed(content("x" * (1 if step % 2 else 4), counted), now=step * 0.02)
        pacer.release(None)
    assert pacer.per_token == pytest.approx(0.008, rel=0.15)  # an average of gap / tokens would say 12.5 ms


def test_a_gap_longer_than_the_bound_releases_at_once():
    pacer = Pacer(max_delay_s=0.15)
    pacer.feed(content("ab", 2), now=0.0)
    pacer.feed(content("cd", 4), now=0.02)
    pacer.release(None)
    pacer.feed(content("efgh", 8), now=0.5)
    assert dues(pacer) == [0.5] * 4


def test_the_end_is_never_held_and_order_is_kept():
    pacer = Pacer(max_delay_s=1.0)
    pacer.feed(content("ab", 2), now=0.0)
    pacer.release(None)
    pacer.feed(content("cdef", 6), now=0.2)  # 50 ms a token: pieces held up to 0.35
    pacer.feed(content("", 6, "stop") + sse(builder().usage_chunk(PROMPT, 6)) + SSE_DONE, now=0.21)
    out = pacer.release(0.21)  # everything is due when the finish arrives
    assert not pacer.held
    assert text_of(out) == "cdef"
    assert out.endswith(SSE_DONE)
    finish = chunks(out)[-2]
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert chunks(out)[-1]["usage"]["completion_tokens"] == 6  # the usage chunk passes untouched


def test_only_the_last_piece_carries_the_finish_reason():
    pacer = Pacer(max_delay_s=0.15)
    pacer.feed(content("abc", 3, "stop"), now=0.0)
    pieces = chunks(pacer.release(None))
    assert [c["choices"][0]["finish_reason"] for c in pieces] == [None, None, "stop"]


def test_the_running_count_is_kept_per_piece_when_the_client_asked_for_it():
    pacer = Pacer(max_delay_s=0.15, keep_counts=True)
    pacer.feed(role() + content("abcd", 4), now=0.0)
    pieces = chunks(pacer.release(None))
    assert [c["usage"]["completion_tokens"] for c in pieces] == [0, 1, 2, 3, 4]
    assert pieces[-1]["usage"]["total_tokens"] == PROMPT + 4


def test_logprobs_tokens_give_the_split():
    chunk = builder().chunk("Hello world", None, usage(PROMPT, 2))
    chunk["choices"][0]["logprobs"] = {"content": [{"token": "Hello", "logprob": -0.1},
                                                   {"token": " world", "logprob": -0.2}]}
    pacer = Pacer(max_delay_s=0.15)
    pacer.feed(sse(chunk), now=0.0)
    pieces = chunks(pacer.release(None))
    assert [c["choices"][0]["delta"]["content"] for c in pieces] == ["Hello", " world"]
    assert [c["choices"][0]["logprobs"]["content"][0]["logprob"] for c in pieces] == [-0.1, -0.2]


def test_completions_chunks_are_split_too():
    pacer = Pacer(max_delay_s=0.15)
    pacer.feed(content("abcdef", 3, endpoint="completions"), now=0.0)
    assert [c["choices"][0]["text"] for c in chunks(pacer.release(None))] == ["ab", "cd", "ef"]


def test_events_it_does_not_read_pass_untouched():
    odd = [b": comment\n\n", b"event: ping\ndata: {}\n\n", b"data: not json\n\n",
           b'data: {"error":{"message":"boom"}}\n\n', sse(builder().chunk("ab"))]  # no count: one token
    pacer = Pacer(max_delay_s=0.15)
    pacer.feed(b"".join(odd), now=0.0)
    assert pacer.release(None) == b"".join(odd)


def test_split_text_cuts_between_characters():
    assert split_text("héllo wörld", 4) == ["hél", "lo ", "wö", "rld"]
    assert split_text("😀😁", 4) == ["😀", "😁"]  # never more pieces than characters
    assert "".join(split_text("x" * 17, 5)) == "x" * 17


def test_which_streams_are_paced_and_what_the_pool_is_asked():
    policy = parse_policy("""
version: 1
pools:
  spec: {kind: speculative, endpoints: [{url: "http://a"}], pacing: {enabled: true, max_delay_ms: 80}}
  std: {kind: standard, endpoints: [{url: "http://b"}]}
rules: [{name: all, route: spec}]
""")
    spec, std = (Pool(name, policy.pools[name]) for name in ("spec", "std"))
    assert spec.paces({"n": 1}, True) and not spec.paces({}, False) and not spec.paces({"n": 2}, True)
    assert not std.paces({}, True) and std.pacing_delay_s is None  # off unless the pool turns it on
    assert spec.pacing_delay_s == pytest.approx(0.08)
    assert ask_token_counts({"include_usage": True}) == {
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    assert ask_token_counts("nonsense") == {}
    assert client_counts({"stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert not client_counts({"stream_options": {"continuous_usage_stats": True}})


@pytest.mark.parametrize("delay", ["0", "2001", "-5"])
def test_the_bound_is_checked_at_load_with_its_line(delay: str):
    text = f"""version: 1
pools:
  spec:
    kind: speculative
    endpoints: [{{url: "http://a"}}]
    pacing: {{enabled: true, max_delay_ms: {delay}}}
rules: [{{name: all, route: spec}}]
"""
    with pytest.raises(ValueError, match=r"<policy>:6: pools\.spec\.pacing\.max_delay_ms"):
        parse_policy(text)


class Upstream:
    """Runs of events a test hands over one by one; notes whether it was closed."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self.closed = asyncio.Event()

    async def runs(self) -> AsyncIterator[bytes]:
        try:
            while (item := await self.queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.closed.set()


def slow(pacer: Pacer) -> None:
    """A stream that has sent one token a second so far: the next burst's pieces are held for seconds."""
    pacer.gap_s, pacer.tokens = 4.0, 4.0
    pacer.last_run = asyncio.get_running_loop().time()


def test_pace_relays_everything_in_order_and_ends_with_done():
    async def main() -> bytes:
        upstream = Upstream()
        for run in (role() + content("ab", 2), content("cdef", 6), content("gh", 8, "stop") + SSE_DONE, None):
            upstream.queue.put_nowait(run)
        return b"".join([out async for out in Pacer(max_delay_s=0.05).pace(upstream.runs())])

    out = asyncio.run(main())
    assert text_of(out) == "abcdefgh"
    assert [len(c["choices"][0]["delta"]["content"]) for c in chunks(out)[1:]] == [1] * 8
    assert out.endswith(SSE_DONE)


def test_pieces_held_when_the_stream_breaks_go_out_before_the_error():
    async def main() -> tuple[bytes, BaseException]:
        upstream = Upstream()
        pacer = Pacer(max_delay_s=2.0)
        slow(pacer)
        upstream.queue.put_nowait(content("abcd", 4))
        upstream.queue.put_nowait(httpx.ReadError("gone"))
        sent = []
        with pytest.raises(httpx.ReadError) as caught:
            async for out in pacer.pace(upstream.runs()):
                sent.append(out)
        return b"".join(sent), caught.value

    out, error = asyncio.run(main())
    assert text_of(out) == "abcd" and isinstance(error, httpx.ReadError)


def test_nothing_is_sent_after_the_client_leaves_and_no_task_is_left():
    async def main() -> tuple[list[bytes], bool, set[asyncio.Task[Any]]]:
        upstream = Upstream()
        pacer = Pacer(max_delay_s=2.0)
        slow(pacer)
        sent: list[bytes] = []
        first_sent = asyncio.Event()

        async def relay() -> None:
            async for out in pacer.pace(upstream.runs()):
                sent.append(out)
                first_sent.set()

        task = asyncio.ensure_future(relay())
        upstream.queue.put_nowait(content("abcd", 4))
        await first_sent.wait()  # one piece out, three held for seconds
        task.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await task
        left = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
        return sent, upstream.closed.is_set(), left

    sent, closed, left = asyncio.run(main())
    assert text_of(b"".join(sent)) == "a"  # the three held pieces never went out
    assert closed and not left  # the read-ahead ended with the upstream closed
