"""Signals straight from the backends' `/metrics`, with no Prometheus around.

Every read scrapes each endpoint once and keeps the samples of the window;
counters then get Prometheus' `increase()` arithmetic (counter resets,
extrapolation to the window's edges), so both sources agree on the same data.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.control.signals.model import (
    DIALECTS,
    Dialect,
    PoolSignals,
    SignalError,
    Tally,
    Target,
    finite,
    pool_signals,
)
from gateway.policy.guard import GuardSpec

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)
Sample = tuple[float, dict[SeriesKey, float]]  # (time, values)


def parse_exposition(text: str, wanted: set[str]) -> dict[SeriesKey, float]:
    """The samples of the `wanted` metric names in a text exposition; a name
    whose colon came out escaped (`vllm_...`) counts as the original."""
    names = {name: name for name in wanted} | {name.replace(":", "_", 1): name for name in wanted}
    values: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = names.get(sample.name)
            value = finite(float(sample.value))
            if name is not None and value is not None:  # NaN or Inf: as if the sample were missing
                values[(name, tuple(sorted(sample.labels.items())))] = value
    return values


def increase(points: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """Prometheus' extrapolated `increase()` of one counter over [start, end]."""
    if len(points) < 2:
        return None
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
    result = last_v - first_v
    for (_, before), (_, after) in pairwise(points):
        if after < before:  # counter reset
            result += before
    sampled = last_t - first_t
    if sampled <= 0:
        return None
    to_start, to_end = first_t - start, end - last_t
    average_gap = sampled / (len(points) - 1)
    if result > 0 and first_v >= 0:
        to_start = min(to_start, sampled * (first_v / result))
    threshold = average_gap * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average_gap / 2
    interval += to_end if to_end < threshold else average_gap / 2
    return result * interval / sampled


class ScrapeSource:
    def __init__(self, client: httpx.AsyncClient | None = None,
                 clock: Callable[[], float] = time.monotonic, timeout_s: float = 5.0) -> None:
        self.client = client or httpx.AsyncClient(trust_env=False)
        self.clock = clock
        self.timeout_s = timeout_s
        self._history: dict[str, deque[Sample]] = {}

    async def aclose(self) -> None:
        await self.client.aclose()

    async def read(self, targets: Sequence[Target], spec: GuardSpec) -> dict[str, PoolSignals]:
        urls = sorted({url for target in targets for url in target.urls})
        wanted = set().union(*(DIALECTS[t.dialect].metric_names() for t in targets)) if targets else set()
        failures = await asyncio.gather(*(self._scrape(url, wanted) for url in urls))
        now = self.clock()
        if urls and all(failures):
            raise SignalError("no endpoint answered /metrics: " + "; ".join(
                f"{url}: {failure}" for url, failure in zip(urls, failures, strict=True)))
        self._forget(set(urls), now - spec.window_s)
        return {t.pool: self._signals(t, now, spec.window_s) for t in targets}

    async def _scrape(self, url: str, wanted: set[str]) -> str | None:
        """Scrape one endpoint within `timeout_s` in all (an endpoint that trickles
        its answer runs out of time like one that sends nothing); None when it
        answered, else why not. An endpoint that did not answer keeps no sample,
        so its window empties as the check goes on: it goes stale, not stuck."""
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self.client.get(url + "/metrics", timeout=self.timeout_s)
                response.raise_for_status()
        except TimeoutError:
            return f"no complete answer within {self.timeout_s:g} s"
        except httpx.HTTPError as exc:
            return type(exc).__name__
        try:
            values = await asyncio.to_thread(parse_exposition, response.text, wanted)
        except Exception as exc:  # noqa: BLE001 (whatever the parser raises, the scrape failed)
            return f"unreadable exposition: {type(exc).__name__}"
        self._history.setdefault(url, deque()).append((self.clock(), values))
        return None

    def _forget(self, urls: set[str], oldest: float) -> None:
        for url in list(self._history):
            if url not in urls:
                del self._history[url]
                continue
            samples = self._history[url]
            while samples and samples[0][0] < oldest:
                samples.popleft()

    def _signals(self, target: Target, now: float, window_s: float) -> PoolSignals:
        dialect = DIALECTS[target.dialect]
        tallies = {address: tally_window(self._history.get(url, ()), dialect, now - window_s, now)
                   for url, address in zip(target.urls, target.addresses, strict=True)}
        return pool_signals(tallies, dialect)


def tally_window(samples: Iterable[Sample], dialect: Dialect, start: float, end: float) -> Tally:
    """One endpoint's tally from the samples it kept for the window."""
    series: dict[SeriesKey, list[tuple[float, float]]] = {}
    for t, values in samples:
        if start <= t <= end:
            for key, value in values.items():
                series.setdefault(key, []).append((t, value))
    roles = _roles(dialect)
    tally = Tally()
    for (name, labels), points in series.items():
        kind, role = roles[name]
        label_map = dict(labels)
        if kind == "latest":
            tally.latest[role] = tally.latest.get(role, 0.0) + points[-1][1]
            continue
        if kind == "averaged":
            tally.averaged[role] = sum(v for _, v in points) / len(points)
            continue
        grown = increase(points, start, end)
        if grown is None:
            continue
        if kind == "counters":
            tally.counters[role] = tally.counters.get(role, 0.0) + grown
        elif kind == "per_position":
            position = int(label_map.get("position", "0"))
            tally.per_position[position] = tally.per_position.get(position, 0.0) + grown
        else:
            tally.add_bucket(role, float(label_map.get("le", "+Inf")), grown)
    return tally


def _roles(dialect: Dialect) -> Mapping[str, tuple[str, str]]:
    roles = {name: ("counters", role) for role, name in dialect.counters.items()}
    roles.update({name: ("latest", role) for role, name in dialect.latest.items()})
    roles.update({name: ("averaged", role) for role, name in dialect.averaged.items()})
    roles.update({f"{name}_bucket": ("buckets", metric) for metric, name in dialect.histograms.items()})
    if dialect.per_position:
        roles[dialect.per_position] = ("per_position", "")
    return roles
