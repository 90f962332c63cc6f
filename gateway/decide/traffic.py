"""Traffic classes and the time per output token each class sees, per pool.

A class is a domain (from the policy's classifier) and a fixed temperature
bucket, written `domain/bucket`. `TokenMeter` wraps a streamed answer's byte
stream and counts server-sent data events (one per token or per engine step)
with two timestamps; `ClassLatency` keeps a sliding window of the resulting
time-per-output-token per (class, pool) for the guard to compare.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import httpx

TEMPERATURE_BUCKETS = ((0.0, "greedy"), (0.5, "low"), (1.0, "mid"))  # upper bound (inclusive), name
HOT = "hot"
USAGE_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*([0-9]+)')
DONE = b"data: [DONE]"


def temperature_bucket(temperature: float) -> str:
    for bound, name in TEMPERATURE_BUCKETS:
        if temperature <= bound:
            return name
    return HOT


def traffic_class(domain: str, temperature: float) -> str:
    return f"{domain}/{temperature_bucket(temperature)}"


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


@dataclass(frozen=True)
class ClassComparison:
    traffic_class: str
    speculative_s: float  # median time per output token on the speculative pool
    standard_s: float
    samples: tuple[int, int]

    @property
    def slower_pct(self) -> float:
        return (self.speculative_s / self.standard_s - 1) * 100 if self.standard_s > 0 else 0.0

    def to_json(self) -> dict[str, float | str | list[int]]:
        return {"class": self.traffic_class, "speculative_tpot_s": self.speculative_s,
                "standard_tpot_s": self.standard_s, "slower_pct": round(self.slower_pct, 3),
                "samples": list(self.samples)}


class ClassLatency:
    """Sliding windows of time-per-output-token by (class, pool). Bounded: at most
    `max_samples` per window and only the classes and pools the policy can produce."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_samples: int = 1024) -> None:
        self.clock = clock
        self.max_samples = max_samples
        self._windows: dict[tuple[str, str], deque[tuple[float, float]]] = {}

    def record(self, traffic_class: str, pool: str, seconds_per_token: float) -> None:
        window = self._windows.get((traffic_class, pool))
        if window is None:
            window = self._windows[(traffic_class, pool)] = deque(maxlen=self.max_samples)
        window.append((self.clock(), seconds_per_token))

    def samples(self, traffic_class: str, pool: str, window_s: float) -> list[float]:
        oldest = self.clock() - window_s
        window = self._windows.get((traffic_class, pool), deque())
        while window and window[0][0] < oldest:
            window.popleft()
        return [value for _, value in window]

    def classes(self) -> set[str]:
        return {traffic_class for traffic_class, _ in self._windows}

    def compare(self, speculative: str, standard: str, window_s: float, min_samples: int,
                classes: Iterable[str] | None = None) -> list[ClassComparison]:
        """Classes with at least `min_samples` on both pools, and their median TPOTs."""
        found = []
        for traffic_class in sorted(self.classes() if classes is None else classes):
            spec = self.samples(traffic_class, speculative, window_s)
            std = self.samples(traffic_class, standard, window_s)
            if len(spec) >= min_samples and len(std) >= min_samples:
                found.append(ClassComparison(traffic_class, statistics.median(spec), statistics.median(std),
                                             (len(spec), len(std))))
        return found
