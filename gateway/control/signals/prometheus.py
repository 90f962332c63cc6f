"""Signals from a Prometheus server's HTTP API (`/api/v1/query`).

Each pool's series are selected by one label matcher (policy `guard.target`):
by default `instance=~"host:port|..."` built from the pool's endpoint URLs.
Counters and buckets are read as `increase(...[window])` per instance, so the
arithmetic afterwards is the same as the scrape source's. Custom PromQL
(`guard.queries`) replaces single signals; `$selector`, `$window` and `$pool`
expand in it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from string import Template
from typing import Any

import httpx

from gateway.control.signals.model import DIALECTS, PoolSignals, SignalError, Tally, Target, pool_signals, settle
from gateway.control.signals.prometheus_api import PrometheusClient
from gateway.policy.guard import GuardSpec

QUERY_SIGNALS = {"accept_rate": "acceptance_rate", "mean_accepted_length": "mean_accepted_length",
                 "draft_tokens": "volume_tokens", "itl_p95": "itl_p95", "e2e_p95": "e2e_p95",
                 "tpot_p95": "tpot_p95", "running": "running", "waiting": "waiting"}


def selector(target: Target, spec: GuardSpec) -> str:
    """The label matcher (without braces) that picks the pool's series."""
    value = spec.target.value
    if "{endpoints}" in value:
        value = value.replace("{endpoints}", "|".join(re.escape(a) for a in target.addresses))
    value = value.replace("{pool}", re.escape(target.pool))
    return f'{spec.target.label}=~"{_promql_string(value)}"'


def series(name: str, match: str) -> str:
    """A series selector for `name` that also finds it with its colon escaped:
    Prometheus stores `vllm_*` when it scrapes vLLM's exporter in OpenMetrics
    (its default) unless a metric_relabel_config restores the `vllm:` names."""
    prefix, colon, rest = name.partition(":")
    pattern = f"{re.escape(prefix)}[:_]{re.escape(rest)}" if colon else re.escape(name)
    return f'{{__name__=~"{_promql_string(pattern)}",{match}}}'


def _promql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


class PrometheusSource:
    def __init__(self, url: str, client: httpx.AsyncClient | None = None, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.api = PrometheusClient(url, client, timeout_s)
        self.timeout_s = timeout_s
        self.clock = clock  # Unix time: the instant every query of one read is evaluated at

    async def aclose(self) -> None:
        await self.api.aclose()

    async def read(self, targets: Sequence[Target], spec: GuardSpec) -> dict[str, PoolSignals]:
        """All pools' signals within `timeout_s` in all (a server that trickles its
        answers runs out of time like one that sends nothing). Every query is
        evaluated at one instant, so the ratios of two series' increases (accepted
        over drafted tokens) compare the same window, not windows a scrape apart."""
        at = self.clock()
        try:
            async with asyncio.timeout(self.timeout_s):
                results = await asyncio.gather(*(self._read_pool(t, spec, at) for t in targets))
        except TimeoutError:
            raise SignalError(f"prometheus at {self.api.url} gave no complete answer within "
                              f"{self.timeout_s:g} s") from None
        return {t.pool: signals for t, signals in zip(targets, results, strict=True)}

    async def _read_pool(self, target: Target, spec: GuardSpec, at: float) -> PoolSignals:
        dialect = DIALECTS[target.dialect]
        match = selector(target, spec)
        window = spec.window
        jobs: list[tuple[str, str, str]] = []  # (kind, role, promql)
        for role, name in dialect.counters.items():
            jobs.append(("counters", role, f"sum by (instance) (increase({series(name, match)}[{window}]))"))
        if dialect.per_position:
            jobs.append(("per_position", "", f"sum by (instance, position) "
                                             f"(increase({series(dialect.per_position, match)}[{window}]))"))
        for role, name in dialect.latest.items():
            jobs.append(("latest", role, f"sum by (instance) ({series(name, match)})"))
        for role, name in dialect.averaged.items():
            jobs.append(("averaged", role,
                         f"avg by (instance) (avg_over_time({series(name, match)}[{window}]))"))
        for metric, name in dialect.histograms.items():
            jobs.append(("buckets", metric,
                         f"sum by (instance, le) (increase({series(name + '_bucket', match)}[{window}]))"))
        answers = await asyncio.gather(*(self.api.query(promql, at) for _, _, promql in jobs))
        tallies: dict[str, Tally] = {}
        for (kind, role, _), vector in zip(jobs, answers, strict=True):
            for labels, value in vector:
                tally = tallies.setdefault(labels.get("instance", ""), Tally())
                if kind == "per_position":
                    tally.per_position[int(labels.get("position", "0"))] = value
                elif kind == "buckets":
                    tally.add_bucket(role, float(labels.get("le", "+Inf")), value)
                else:
                    getattr(tally, kind)[role] = value
        return await self._overridden(pool_signals(tallies, dialect), target, spec, match, at)

    async def _overridden(self, signals: PoolSignals, target: Target, spec: GuardSpec,
                          match: str, at: float) -> PoolSignals:
        if not spec.queries:
            return signals
        names = list(spec.queries)
        texts = [Template(spec.queries[n]).safe_substitute(selector=match, window=spec.window, pool=target.pool)
                 for n in names]
        answers = await asyncio.gather(*(self.api.query(text, at) for text in texts))
        changes: dict[str, Any] = {}
        for name, vector in zip(names, answers, strict=True):
            values = [value for _, value in vector]
            changes[QUERY_SIGNALS[name]] = sum(values) if values else (0.0 if name == "draft_tokens" else None)
        return settle(replace(signals, **changes))
