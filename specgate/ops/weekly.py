"""The operations report: what speculation did over a period, read from Prometheus.

Numbers and the PromQL behind them:

- acceptance: `rate(accepted) / rate(draft)` of vLLM's V1 spec-decode counters,
  evaluated every `step` over the period (query_range) for average, minimum and
  maximum, plus the token-weighted ratio of the two increases over the whole period;
- E2E p50 from the gateway's `specgate_request_duration_seconds` histogram, and
  the speedup against a recorded baseline (`specgate baseline record`);
- fallbacks: increases of `specgate_flag_flips_total` whose reason turned
  speculation off by itself (low acceptance, latency regression, stale metrics);
- time in fallback: how long `specgate_speculative_enabled` was 0, per pool;
- traffic share per pool from `specgate_requests_total`.

Recommendations follow the usual thresholds: acceptance under 0.55, speedup
under 1.3x, more than 5 fallbacks a week.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gateway.control.baseline import Baseline
from gateway.control.signals.prometheus import series
from gateway.control.signals.prometheus_api import PrometheusClient

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
FALLBACK_REASONS = ("low_acceptance", "latency_regression", "stale")
MIN_ACCEPTANCE = 0.55
MIN_SPEEDUP = 1.3
MAX_FALLBACKS_PER_WEEK = 5
WEEK_S = 7 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": WEEK_S}


def parse_duration(text: str) -> float:
    """`90s`, `30m`, `12h`, `7d`, `1w` in seconds."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*", text)
    if not match or float(match[1]) <= 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30m, 12h, 7d)")
    return float(match[1]) * _UNITS[match[2]]


@dataclass(frozen=True)
class Period:
    start: float
    end: float
    step_s: float  # spacing of the acceptance points (and their rate window)
    resolution_s: float = 60.0  # sampling of the enabled gauge for time in fallback

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def range(self) -> str:
        return f"{int(round(self.seconds))}s"


def series_selector(name: str, match: str) -> str:
    return series(name, match) if match else series(name, "").replace(",}", "}")


async def _scalar(api: PrometheusClient, promql: str, at: float) -> float | None:
    rows = await api.query(promql, at)
    return rows[0][1] if rows else None


async def _by(api: PrometheusClient, promql: str, at: float, label: str) -> dict[str, float]:
    return {labels.get(label, ""): value for labels, value in await api.query(promql, at)}


async def _range(api: PrometheusClient, promql: str, period: Period) -> list[float]:
    """The values of a single-series range query, one every `period.step_s`."""
    rows = await api.query_range(promql, period.start + period.step_s, period.end, period.step_s)
    return [value for _, values in rows for value in values]


async def acceptance(api: PrometheusClient, period: Period, match: str = "") -> dict[str, Any]:
    accepted, drafted = series_selector(ACCEPTED, match), series_selector(DRAFTED, match)
    window = f"{int(period.step_s)}s"
    points = await _range(api, f"sum(rate({accepted}[{window}])) / sum(rate({drafted}[{window}]))", period)
    overall = await _scalar(api, f"sum(increase({accepted}[{period.range}])) / "
                                 f"sum(increase({drafted}[{period.range}]))", period.end)
    drafts = await _scalar(api, f"sum(increase({drafted}[{period.range}]))", period.end)
    return {"avg": sum(points) / len(points) if points else None, "min": min(points, default=None),
            "max": max(points, default=None), "overall": overall, "points": len(points),
            "draft_tokens": drafts or 0.0}


async def latency(api: PrometheusClient, period: Period, baseline: Baseline | None) -> dict[str, Any]:
    buckets = f"increase(specgate_request_duration_seconds_bucket[{period.range}])"
    p50 = await _scalar(api, f"histogram_quantile(0.5, sum by (le) ({buckets}))", period.end)
    by_pool = await _by(api, f"histogram_quantile(0.5, sum by (pool, le) ({buckets}))", period.end, "pool")
    speedup = baseline.e2e_s.p50 / p50 if baseline and p50 else None
    return {"e2e_p50_s": p50, "e2e_p50_s_by_pool": by_pool, "speedup": speedup,
            "baseline_e2e_p50_s": baseline.e2e_s.p50 if baseline else None,
            "baseline_recorded_at": baseline.recorded_at.isoformat() if baseline else None}


async def fallbacks(api: PrometheusClient, period: Period) -> dict[str, Any]:
    flips = {reason: round(value) for reason, value in
             (await _by(api, f"sum by (reason) (increase(specgate_flag_flips_total[{period.range}]))",
                        period.end, "reason")).items()}
    res = int(period.resolution_s)
    off = await _by(api, f"sum_over_time((min by (pool) (specgate_speculative_enabled) == bool 0)"
                         f"[{period.range}:{res}s]) * {res}", period.end, "pool")
    return {"count": sum(flips.get(reason, 0) for reason in FALLBACK_REASONS), "flips_by_reason": flips,
            "seconds_off_by_pool": off}


async def traffic(api: PrometheusClient, period: Period) -> dict[str, Any]:
    counts = await _by(api, f"sum by (pool) (increase(specgate_requests_total[{period.range}]))",
                       period.end, "pool")
    total = sum(counts.values())
    return {"requests": total, "requests_by_pool": counts,
            "share_by_pool": {pool: count / total for pool, count in counts.items()} if total else {}}


def recommendations(report: Mapping[str, Any]) -> list[str]:
    advice = []
    rate = report["acceptance"]["avg"]
    if rate is not None and rate < MIN_ACCEPTANCE:
        advice.append(f"Average acceptance {rate:.2f} is under {MIN_ACCEPTANCE}: retrain the draft "
                      "(EAGLE-3 head) or change the draft model.")
    speedup = report["latency"]["speedup"]
    if speedup is not None and speedup < MIN_SPEEDUP:
        advice.append(f"E2E p50 speedup {speedup:.2f}x is under {MIN_SPEEDUP}x: reconsider whether "
                      "speculation pays for its cost on this traffic.")
    limit = MAX_FALLBACKS_PER_WEEK * report["period"]["seconds"] / WEEK_S
    count = report["fallbacks"]["count"]
    if count > limit:
        advice.append(f"{count} automatic fallbacks (more than {MAX_FALLBACKS_PER_WEEK} a week): "
                      "check the draft model's quality on current traffic.")
    return advice


async def build_report(api: PrometheusClient, period: Period, baseline: Baseline | None = None,
                       spec_match: str = "") -> dict[str, Any]:
    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).isoformat()

    report: dict[str, Any] = {
        "period": {"start": iso(period.start), "end": iso(period.end), "seconds": period.seconds,
                   "step_s": period.step_s},
        "acceptance": await acceptance(api, period, spec_match),
        "latency": await latency(api, period, baseline),
        "fallbacks": await fallbacks(api, period),
        "traffic": await traffic(api, period),
    }
    report["recommendations"] = recommendations(report)
    return report


def read_report(url: str, period: Period, baseline: Baseline | None = None, spec_match: str = "",
                timeout_s: float = 60.0) -> dict[str, Any]:
    """The report from the Prometheus at `url`; raises SignalError when it cannot be read."""
    async def read() -> dict[str, Any]:
        api = PrometheusClient(url, timeout_s=timeout_s)
        try:
            return await build_report(api, period, baseline, spec_match)
        finally:
            await api.aclose()

    return asyncio.run(read())
