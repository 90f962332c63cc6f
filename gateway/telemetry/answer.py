"""What a span reads off a backend's answer on its way to the client: the
usage (input and output tokens) and the finish reasons, for the three APIs
the gateway speaks. OpenAI puts usage and finish reasons at the end of an
answer; Anthropic's stream gives the input tokens in its first event. So the
watch keeps the answer's first chunk and its last `TAIL_BYTES`, and reads
them once, at the end: per chunk it costs a list append."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

TAIL_BYTES = 8192
INPUT = re.compile(rb'"(?:prompt_tokens|input_tokens)"\s*:\s*([0-9]+)')
OUTPUT = re.compile(rb'"(?:completion_tokens|output_tokens)"\s*:\s*([0-9]+)')
FINISH = re.compile(rb'"(?:finish_reason|stop_reason)"\s*:\s*"([A-Za-z0-9_.-]{1,64})"')


@dataclass(frozen=True, slots=True)
class AnswerFacts:
    input_tokens: int | None
    output_tokens: int | None
    finish_reasons: tuple[str, ...]


def read_facts(head: bytes, tail: bytes) -> AnswerFacts:
    """The last usage counts in `tail` (else `head`), and the finish reasons in `tail`, each once, in order.
    A quote inside a JSON string is escaped, so no key is matched inside generated text."""
    reasons = tuple(dict.fromkeys(found.group(1).decode() for found in FINISH.finditer(tail)))
    return AnswerFacts(_last(INPUT, tail, head), _last(OUTPUT, tail, head), reasons)


def _last(pattern: re.Pattern[bytes], *places: bytes) -> int | None:
    for data in places:
        counts = pattern.findall(data)
        if counts:
            return int(counts[-1])
    return None


class AnswerWatch(httpx.AsyncByteStream):
    """Passes an answer's byte stream through, keeping its first chunk and its last bytes."""

    def __init__(self, stream: httpx.AsyncByteStream) -> None:
        self.stream = stream
        self.head = b""
        self.chunks: list[bytes] = []
        self.size = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            if not self.head:
                self.head = chunk[:TAIL_BYTES]
            self.chunks.append(chunk)
            self.size += len(chunk)
            while self.size - len(self.chunks[0]) >= TAIL_BYTES:
                self.size -= len(self.chunks.pop(0))
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()

    def facts(self) -> AnswerFacts:
        return read_facts(self.head, b"".join(self.chunks))
