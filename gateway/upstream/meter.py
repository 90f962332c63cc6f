"""Measuring an answer in output tokens.

`TokenMeter` wraps a streamed answer's byte stream and notes when its first
and last server-sent events arrived. A speculative engine step sends several
tokens in one event, so the events are not the tokens: the count comes from
the usage block, which the request's `UsagePlan` (usage.py) asks for, reads
and takes out again. `Measurement` is what one answered request tells of
its pool.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import httpx

from gateway.upstream.drafting import Drafting
from gateway.upstream.usage import completion_tokens, done_events


class TokenMeter(httpx.AsyncByteStream):
    """Passes a response stream through, noting how many events of generated
    output went by (`mark`: the plan's, `data:` for OpenAI's APIs) and when
    the first and last arrived. Per chunk: one count and one clock read."""

    def __init__(self, stream: httpx.AsyncByteStream, clock: Callable[[], float] = time.perf_counter,
                 mark: bytes = b"data:") -> None:
        self.stream = stream
        self.mark = mark
        self.clock = clock
        self.events = 0
        self.first = 0.0
        self.last = 0.0
        self.tail = b""  # the last chunk: may carry usage and [DONE]
        self._read_tail: bytes | None = None  # the tail `counted` searched, and what it found
        self._count: int | None = None
        self._chunks: AsyncIterator[bytes] = self.stream.__aiter__()

    # An iterator of its own rather than an async generator, which mypyc cannot compile.
    def __aiter__(self) -> TokenMeter:
        self._chunks = self.stream.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._chunks.__anext__()
        events = chunk.count(self.mark)
        if events:
            now = self.clock()
            if not self.events:
                self.first = now
            self.last = now
            self.events += events
            self.tail = chunk
        return chunk

    async def aclose(self) -> None:
        await self.stream.aclose()

    def counted(self) -> int | None:
        """The usage block's output token count in the last chunk, or None: searched once a tail."""
        if self._read_tail is not self.tail:
            self._read_tail, self._count = self.tail, completion_tokens(self.tail)
        return self._count

    def tokens(self) -> int:
        """Output tokens: the usage block's count when the stream has one, else data events."""
        found = self.counted()
        if found is not None:
            return found
        return self.events - done_events(self.tail)

    def time_per_token(self) -> float | None:
        """Seconds per output token after the first, or None for too short a stream."""
        return per_token(self.last - self.first, self.tokens())


def per_token(decode_s: float, tokens: int) -> float | None:
    """Seconds per output token after the first, or None when there is no gap to divide."""
    if tokens < 2 or decode_s <= 0:
        return None
    return decode_s / (tokens - 1)


class Measurement:
    """One answered request, as its pool served it. Times count from the
    moment its body was complete (its dispatch). A streamed answer gives its first token's
    time and so a time per output token (the decode time over the tokens after
    the first); a whole body arrives at once and gives neither. A plain class, its `__init__`
    written out: one is built per answer, and a named tuple's `__new__` is interpreted Python."""

    __slots__ = ("pool", "traffic_class", "load", "e2e_s", "tokens", "streamed", "ttft_s", "tpot_s", "drafting",
                 "batch")

    def __init__(self, pool: str, traffic_class: str | None, load: int, e2e_s: float, tokens: int, streamed: bool,
                 ttft_s: float | None = None, tpot_s: float | None = None, drafting: Drafting | None = None,
                 batch: float | None = None) -> None:
        self.pool = pool
        self.traffic_class = traffic_class  # None for a domain the policy does not define
        self.load = load  # the pool's load when the request was routed
        self.e2e_s = e2e_s
        self.tokens = tokens  # output tokens
        self.streamed = streamed
        self.ttft_s = ttft_s
        self.tpot_s = tpot_s
        self.drafting = drafting  # tokens per step, as the backend reported or its events showed
        self.batch = batch  # the pool's mean in flight while it ran, itself included: what it decoded in

    def _fields(self) -> tuple[object, ...]:
        return (self.pool, self.traffic_class, self.load, self.e2e_s, self.tokens, self.streamed, self.ttft_s,
                self.tpot_s, self.drafting, self.batch)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Measurement) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"Measurement{self._fields()!r}"

    @classmethod
    def of_stream(cls, pool: str, traffic_class: str | None, load: int, meter: TokenMeter,
                  started: float, tokens: int, steps_are_events: bool = True,
                  batch: float | None = None) -> Measurement:
        """`steps_are_events`: the API sends one data event per engine step (OpenAI's chunks do;
        Anthropic's and Responses' framing adds events of their own, so there only a reported
        acceptance counts)."""
        ttft, e2e = meter.first - started, meter.last - started
        drafting = Drafting.reported(meter.tail)
        if drafting is None and steps_are_events:
            drafting = Drafting.of_events(tokens, meter.events, meter.counted() is not None)
        return cls(pool, traffic_class, load, e2e, tokens, True, ttft, per_token(e2e - ttft, tokens), drafting,
                   batch)
