"""What a span reads off an answer: usage and finish reasons, in each API's own shape."""

from __future__ import annotations

import asyncio
import json

import httpx

from gateway.telemetry.answer import TAIL_BYTES, AnswerFacts, AnswerWatch, read_facts


def sse(*events: dict, done: bool = False) -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def watched(chunks: list[bytes]) -> AnswerFacts:
    watch = AnswerWatch(_Chunks(chunks))

    async def drain() -> bytes:
        return b"".join([chunk async for chunk in watch])

    assert asyncio.run(drain()) == b"".join(chunks), "the answer passes through untouched"
    return watch.facts()


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk


def test_an_openai_stream_gives_its_usage_chunk_and_finish_reason():
    text = [sse({"choices": [{"index": 0, "delta": {"content": "x " * 500}, "finish_reason": None}]})] * 40
    end = sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 64, "total_tokens": 76}}, done=True)
    assert sum(map(len, text)) > 4 * TAIL_BYTES
    assert watched([*text, end]) == AnswerFacts(12, 64, ("length",))


def test_an_anthropic_stream_gives_input_tokens_first_and_output_tokens_last():
    start = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","stop_reason":null,'
             b'"usage":{"input_tokens":21,"output_tokens":1}}}\n\n')
    middle = [b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta",'
              b'"text":"' + b"y" * 1000 + b'"}}\n\n'] * 20
    end = (b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
           b'"usage":{"output_tokens":30}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert watched([start, *middle, end]) == AnswerFacts(21, 30, ("end_turn",))


def test_whole_bodies_and_a_responses_stream():
    chat = json.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"},
                                   {"message": {"content": "ho"}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 2}}).encode()
    assert read_facts(chat[:100], chat) == AnswerFacts(5, 2, ("stop",))
    completed = sse({"type": "response.completed", "response": {"status": "completed",
                                                                "usage": {"input_tokens": 9, "output_tokens": 3}}})
    assert read_facts(b"", completed) == AnswerFacts(9, 3, ())


def test_generated_text_that_looks_like_usage_is_not_read():
    tricky = sse({"choices": [{"delta": {"content": '"completion_tokens": 999, "finish_reason":"evil"'},
                               "finish_reason": None}]})
    assert read_facts(tricky, tricky) == AnswerFacts(None, None, ())
