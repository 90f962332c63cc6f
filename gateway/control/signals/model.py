"""What the guard reads from a pool's backends, independent of where it came from.

A source (Prometheus or a direct scrape) fills one `Tally` per endpoint: the
increase of each counter over the window, the latest load gauges, the window
average of rate gauges, the increase of each histogram bucket. `compute`
turns a tally into `PoolSignals` the same way for every source, so the two
sources agree whenever they saw the same samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

QUANTILE = 0.95


class SignalError(Exception):
    """The metrics could not be read (source down, query error, bad answer)."""


def finite(value: float | None) -> float | None:
    """The value, or None for NaN, +Inf and -Inf: a number JSON and comparisons can use."""
    return value if value is not None and math.isfinite(value) else None


def fraction(value: float | None) -> float | None:
    """A finite value clamped to [0, 1]. Ratios of two counters' rates can leave
    the range when the series were not sampled at the same instants."""
    value = finite(value)
    return None if value is None else min(max(value, 0.0), 1.0)


@dataclass(frozen=True)
class Dialect:
    """Metric names of one engine family, by the role they play."""
    counters: Mapping[str, str]  # role -> counter name (with _total)
    per_position: str | None  # counter with a `position` label
    latest: Mapping[str, str]  # role -> gauge read at the last sample
    averaged: Mapping[str, str]  # role -> gauge averaged over the window
    histograms: Mapping[str, str]  # latency metric (itl, e2e, tpot) -> histogram base name
    volume: str  # counter role that says whether the window holds enough data

    def metric_names(self) -> set[str]:
        names = {*self.counters.values(), *self.latest.values(), *self.averaged.values()}
        names |= {f"{h}_bucket" for h in self.histograms.values()}
        if self.per_position:
            names.add(self.per_position)
        return names


DIALECTS: Mapping[str, Dialect] = {
    "vllm": Dialect(
        counters={"drafts": "vllm:spec_decode_num_drafts_total",
                  "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
                  "accepted": "vllm:spec_decode_num_accepted_tokens_total"},
        per_position="vllm:spec_decode_num_accepted_tokens_per_pos_total",
        latest={"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"},
        averaged={},
        histograms={"itl": "vllm:inter_token_latency_seconds",
                    "e2e": "vllm:e2e_request_latency_seconds",
                    "tpot": "vllm:request_time_per_output_token_seconds"},
        volume="draft_tokens",
    ),
    "sglang": Dialect(
        counters={"generated": "sglang:generation_tokens_total"},
        per_position=None,
        latest={"running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs"},
        averaged={"accept_rate": "sglang:spec_accept_rate", "accept_length": "sglang:spec_accept_length"},
        histograms={"itl": "sglang:inter_token_latency_seconds",
                    "e2e": "sglang:e2e_request_latency_seconds",
                    "tpot": "sglang:time_per_output_token_seconds"},
        volume="generated",
    ),
}


@dataclass(frozen=True)
class Target:
    """A pool as the sources see it."""
    pool: str
    dialect: str
    urls: tuple[str, ...]

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(address(url) for url in self.urls)


def address(url: str) -> str:
    """host:port of an endpoint URL: the `instance` label Prometheus gives its scrapes."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


@dataclass
class Tally:
    counters: dict[str, float] = field(default_factory=dict)
    per_position: dict[int, float] = field(default_factory=dict)
    latest: dict[str, float] = field(default_factory=dict)
    averaged: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)

    def add_bucket(self, metric: str, le: float, value: float) -> None:
        target = self.buckets.setdefault(metric, {})
        target[le] = target.get(le, 0.0) + value


@dataclass(frozen=True)
class PoolSignals:
    acceptance_rate: float | None
    mean_accepted_length: float | None
    per_position: tuple[float, ...]
    volume_tokens: float  # draft tokens (sglang: generated tokens) in the window
    itl_p95: float | None
    e2e_p95: float | None
    tpot_p95: float | None
    running: float | None
    waiting: float | None
    endpoints: Mapping[str, PoolSignals] = field(default_factory=dict)

    def p95(self, metric: str) -> float | None:
        return {"itl": self.itl_p95, "e2e": self.e2e_p95, "tpot": self.tpot_p95}[metric]

    @property
    def reported_load(self) -> int | None:
        if self.running is None and self.waiting is None:
            return None
        return int((self.running or 0) + (self.waiting or 0))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["per_position"] = list(self.per_position)
        data["endpoints"] = {name: s.to_json() for name, s in self.endpoints.items()}
        return data


def merge(tallies: Iterable[Tally]) -> Tally:
    """A pool's tally from its endpoints': sums, except averaged gauges (means)."""
    pool = Tally()
    averaged: dict[str, list[float]] = {}
    for tally in tallies:
        for kind in ("counters", "per_position", "latest"):
            mine, theirs = getattr(pool, kind), getattr(tally, kind)
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0.0) + value
        for key, value in tally.averaged.items():
            averaged.setdefault(key, []).append(value)
        for metric, buckets in tally.buckets.items():
            for le, value in buckets.items():
                pool.add_bucket(metric, le, value)
    pool.averaged = {key: sum(values) / len(values) for key, values in averaged.items()}
    return pool


def compute(tally: Tally, dialect: Dialect, endpoints: Mapping[str, PoolSignals] | None = None) -> PoolSignals:
    counters = tally.counters
    drafts = counters.get("drafts", 0.0)
    draft_tokens = counters.get("draft_tokens", 0.0)
    accepted = counters.get("accepted", 0.0)
    acceptance = accepted / draft_tokens if draft_tokens > 0 else tally.averaged.get("accept_rate")
    length = 1 + accepted / drafts if drafts > 0 else tally.averaged.get("accept_length")
    per_position = tuple(tally.per_position[p] / drafts for p in sorted(tally.per_position)) if drafts > 0 else ()
    return settle(PoolSignals(
        acceptance_rate=acceptance,
        mean_accepted_length=length,
        per_position=per_position,
        volume_tokens=counters.get(dialect.volume, 0.0),
        itl_p95=histogram_quantile(QUANTILE, tally.buckets.get("itl", {})),
        e2e_p95=histogram_quantile(QUANTILE, tally.buckets.get("e2e", {})),
        tpot_p95=histogram_quantile(QUANTILE, tally.buckets.get("tpot", {})),
        running=tally.latest.get("running"),
        waiting=tally.latest.get("waiting"),
        endpoints=dict(endpoints or {}),
    ))


def pool_signals(tallies: Mapping[str, Tally], dialect: Dialect) -> PoolSignals:
    """A pool's signals from its endpoints' tallies (keyed by host:port): the
    pool's from their merge, each endpoint's own under `endpoints`."""
    endpoints = {name: compute(tally, dialect) for name, tally in sorted(tallies.items())}
    return compute(merge(tallies.values()), dialect, endpoints)


def settle(signals: PoolSignals) -> PoolSignals:
    """The signals with every number finite or None and in its range, whatever a
    source or a custom query handed in: acceptance (overall and per position) in
    [0, 1], accepted length >= 1, counts and latencies >= 0."""
    length = finite(signals.mean_accepted_length)
    return replace(
        signals,
        acceptance_rate=fraction(signals.acceptance_rate),
        mean_accepted_length=None if length is None else max(length, 1.0),
        per_position=tuple(fraction(p) or 0.0 for p in signals.per_position),
        volume_tokens=_at_least_zero(signals.volume_tokens) or 0.0,
        itl_p95=_at_least_zero(signals.itl_p95),
        e2e_p95=_at_least_zero(signals.e2e_p95),
        tpot_p95=_at_least_zero(signals.tpot_p95),
        running=_at_least_zero(signals.running),
        waiting=_at_least_zero(signals.waiting),
        endpoints={name: settle(endpoint) for name, endpoint in signals.endpoints.items()},
    )


def _at_least_zero(value: float | None) -> float | None:
    value = finite(value)
    return None if value is None else max(value, 0.0)


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts keyed by `le`:
    linear interpolation inside the bucket, the lowest bucket starting at 0, and
    the +Inf bucket answering the highest finite bound. None without observations."""
    if not buckets or math.inf not in buckets:
        return None
    bounds = sorted(buckets)
    counts = [buckets[b] for b in bounds]
    for i in range(1, len(counts)):  # Prometheus tolerates tiny non-monotonic counts
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if total <= 0 or len(bounds) < 2:
        return None
    rank = q * total
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(bounds) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0 if index == 0 else bounds[index - 1]
    below = 0.0 if index == 0 else counts[index - 1]
    in_bucket = counts[index] - below
    return start + (bounds[index] - start) * ((rank - below) / in_bucket if in_bucket else 1.0)
