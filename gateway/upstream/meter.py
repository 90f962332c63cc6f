"""Measuring an answer in output tokens.

`TokenMeter` wraps a streamed answer's byte stream and notes when its first
and last server-sent events arrived. A speculative engine step sends several
tokens in one event, so the events are not the tokens: the count comes from
the usage block. When the client did not ask for one, the gateway asks the
pool for it (`stream_options.include_usage`) and `UsageTap` takes the answer
back to what the client would have had without it. `Measurement` is what one
answered request tells of its pool.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

USAGE_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*([0-9]+)')
DONE = b"data: [DONE]"
ANY_DONE = re.compile(rb"data:[ \t]*\[DONE\]")  # as any backend writes it, with or without the space
# Matched with any whitespace a backend puts around JSON separators, in any key order:
FINISH = re.compile(rb'"finish_reason"\s*:\s*"')  # a choice's last chunk: its finish_reason is a string
USAGE = re.compile(rb'"usage"\s*:\s*\{')  # a usage block (not a "usage":null mark)
NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')  # with it: the chunk include_usage adds at the end
USAGE_NULL = b',"usage":null'  # some servers mark every chunk so once usage is asked for
FINGERPRINT = re.compile(rb',"system_fingerprint":"[^"]*"')
EVENT_END = re.compile(rb"\r?\n\r?\n")


def completion_tokens(data: bytes) -> int | None:
    """The last `completion_tokens` count in `data` (a usage block follows the
    choices), or None. A quote inside a JSON string is escaped, so the key
    cannot be matched inside generated text."""
    at = data.rfind(b'"completion_tokens"')
    if at < 0:
        return None
    found = USAGE_TOKENS.match(data, at)
    return int(found.group(1)) if found else None


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
        found = completion_tokens(self.tail)
        if found is not None:
            return found
        return self.events - len(ANY_DONE.findall(self.tail))

    def time_per_token(self) -> float | None:
        """Seconds per output token after the first, or None for too short a stream."""
        return per_token(self.last - self.first, self.tokens())


def per_token(decode_s: float, tokens: int) -> float | None:
    """Seconds per output token after the first, or None when there is no gap to divide."""
    if tokens < 2 or decode_s <= 0:
        return None
    return decode_s / (tokens - 1)


class UsageTap:
    """Reads the output token count off whole SSE events as the relay passes
    them on. `hidden`: the gateway asked for the usage chunk, so the client
    must not see it: the usage-only chunk is dropped, `"usage":null` marks
    are cut (looked for only when the first events had one), and the
    `system_fingerprint` vLLM moves from a choice's last chunk to the usage
    chunk goes back. For that, the events from the last chunk on wait for the
    usage chunk (sent right after it) or for the end of the stream; every
    other event passes at once and untouched. One choice only (n=1): the
    gateway does not ask for usage otherwise. Per run of events: one search
    when hidden, none when not (the usage the client asked for is read once,
    from the last runs, at the end)."""

    def __init__(self, hidden: bool) -> None:
        self.hidden = hidden
        self.held = b""
        self.marks: bool | None = None  # whether the pool marks chunks "usage":null
        self._tokens: int | None = None
        self._before = self._last = b""  # the last two runs of events, when the client asked for usage

    def feed(self, events: bytes) -> bytes:
        """What goes to the client for `events`, a run of whole events."""
        if not self.hidden:
            if events:
                self._before, self._last = self._last, events
            return events
        if self.marks is None:
            self.marks = USAGE_NULL in events
        if self.marks:
            events = events.replace(USAGE_NULL, b"")
        if self.held:
            out, self.held = b"", self.held + events
        else:
            finish = FINISH.search(events)
            if finish is None:
                return events
            start = events.rfind(b"data:", 0, finish.start())
            out, self.held = events[:start], events[start:]
        return out + self._release()

    def flush(self) -> bytes:
        """Whatever is held: the stream ended or broke."""
        held, self.held = self.held, b""
        return held

    def tokens(self) -> int | None:
        """The usage chunk's output token count, or None when none went by."""
        if self.hidden:
            return self._tokens
        found = completion_tokens(self._last)
        return completion_tokens(self._before) if found is None else found

    def _release(self) -> bytes:
        held = self.held
        found = _usage_only(held)
        if found is None:
            return self.flush() if ANY_DONE.search(held) else b""
        start, stop = found
        chunk, last, rest = held[start:stop], held[:start], held[stop:]
        self._tokens = completion_tokens(chunk)
        fingerprint = FINGERPRINT.search(chunk)
        if fingerprint is not None and last and b'"system_fingerprint"' not in last:
            close = last.rfind(b"}")
            last = last[:close] + fingerprint.group() + last[close:]
        self.held = b""
        return last + rest


def _usage_only(events: bytes) -> tuple[int, int] | None:
    """Where the usage-only chunk (a usage block, no choices) is in `events`;
    chunks that carry a usage block beside their choices are passed over."""
    for usage in USAGE.finditer(events):
        start = events.rfind(b"data:", 0, usage.start())
        end = EVENT_END.search(events, usage.start())
        stop = len(events) if end is None else end.end()
        if NO_CHOICES.search(events, start, stop) is not None:
            return start, stop
    return None


@dataclass(frozen=True, slots=True)
class Measurement:
    """One answered request, as its pool served it. Times count from the
    moment its body was complete (its dispatch). A streamed answer gives its first token's
    time and so a time per output token (the decode time over the tokens after
    the first); a whole body arrives at once and gives neither."""
    pool: str
    traffic_class: str | None  # None for a domain the policy does not define
    load: int  # the pool's load when the request was routed
    e2e_s: float
    tokens: int  # output tokens
    streamed: bool
    ttft_s: float | None = None
    tpot_s: float | None = None

    @classmethod
    def of_stream(cls, pool: str, traffic_class: str | None, load: int, meter: TokenMeter,
                  started: float, tokens: int) -> Measurement:
        ttft, e2e = meter.first - started, meter.last - started
        return cls(pool, traffic_class, load, e2e, tokens, True, ttft, per_token(e2e - ttft, tokens))
