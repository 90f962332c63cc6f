"""Measuring a relayed stream: `TokenMeter` wraps a streamed answer's byte
stream and counts server-sent data events (one per token or per engine step)
with two timestamps, from which the time per output token follows."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable

import httpx

USAGE_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*([0-9]+)')
DONE = b"data: [DONE]"


class TokenMeter(httpx.AsyncByteStream):
    """Passes a response stream through, noting how many SSE data events went by
    and when the first and last arrived. Per chunk: one count and one clock read."""

    def __init__(self, stream: httpx.AsyncByteStream, clock: Callable[[], float] = time.perf_counter) -> None:
        self.stream = stream
        self.clock = clock
        self.events = 0
        self.first = 0.0
        self.last = 0.0
        self.tail = b""  # the last chunk: may carry usage and [DONE]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            events = chunk.count(b"data:")
            if events:
                now = self.clock()
                if not self.events:
                    self.first = now
                self.last = now
                self.events += events
                self.tail = chunk
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()

    def tokens(self) -> int:
        """Output tokens: the usage block's count when the stream has one, else data events."""
        found = USAGE_TOKENS.findall(self.tail)
        if found:
            return int(found[-1])
        return self.events - self.tail.count(DONE)

    def time_per_token(self) -> float | None:
        """Seconds per output token after the first, or None for too short a stream."""
        tokens = self.tokens()
        if tokens < 2 or self.last <= self.first:
            return None
        return (self.last - self.first) / (tokens - 1)
