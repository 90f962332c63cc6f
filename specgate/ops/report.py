"""The weekly operations report (`specgate report`) as Markdown, and the previous report's
acceptance per class.

The report reads Prometheus (the server that scrapes the gateway and the
speculative backends) over `--since` up to `--until` (default: now); see
`specgate.ops.weekly` for what is measured and how, and `specgate.ops.retrain`
for the acceptance per traffic class and the retrain hint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specgate.ops.retrain import markdown as retrain_markdown


def _fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "n/a" if value is None else pattern.format(value)


def markdown(report: dict[str, Any]) -> str:
    period, rate, lat = report["period"], report["acceptance"], report["latency"]
    falls, share = report["fallbacks"], report["traffic"]
    lines = [f"# Speculative decoding report: {period['start'][:16]} to {period['end'][:16]} UTC", "",
             "## Acceptance", "",
             "| average | min | max | token-weighted | draft tokens |", "|---|---|---|---|---|",
             f"| {_fmt(rate['avg'])} | {_fmt(rate['min'])} | {_fmt(rate['max'])} | {_fmt(rate['overall'])} "
             f"| {rate['draft_tokens']:.0f} |", "",
             f"Points every {period['step_s']:.0f} s: rate(accepted) / rate(draft).", "",
             "## Latency", "",
             f"- E2E p50 through the gateway: {_fmt(lat['e2e_p50_s'], '{:.3f} s')}",
             f"- baseline E2E p50: {_fmt(lat['baseline_e2e_p50_s'], '{:.3f} s')}"
             + (f" (recorded {lat['baseline_recorded_at']})" if lat["baseline_recorded_at"] else ""),
             f"- speedup: {_fmt(lat['speedup'], '{:.2f}x')}"]
    lines += [f"- E2E p50, pool {pool}: {value:.3f} s" for pool, value in sorted(lat["e2e_p50_s_by_pool"].items())]
    lines += ["", "## Fallbacks", "", f"- automatic fallbacks: {falls['count']}"]
    lines += [f"- flips by reason {reason}: {count}" for reason, count in sorted(falls["flips_by_reason"].items())]
    lines += [f"- time with speculation off, pool {pool}: {seconds / 3600:.2f} h"
              for pool, seconds in sorted(falls["seconds_off_by_pool"].items())]
    lines += ["", "## Traffic", "", "| pool | requests | share |", "|---|---|---|"]
    lines += [f"| {pool} | {share['requests_by_pool'][pool]:.0f} | {value:.1%} |"
              for pool, value in sorted(share["share_by_pool"].items())]
    lines += ["", "## Recommendations", ""]
    lines += [f"- {item}" for item in report["recommendations"]] or ["- none: speculation is paying off."]
    if "retrain" in report:

        lines += retrain_markdown(report["retrain"])
    return "\n".join(lines) + "\n"


def previous_by_class(path: Path | None) -> dict[str, Any]:
    """The per-class acceptance of an earlier report.json (empty without one)."""
    if path is None:
        return {}
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        by_class = earlier.get("retrain", {}).get("by_class", {})
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"cannot read the previous report {path}: {exc}") from exc
    if not isinstance(by_class, dict):
        raise ValueError(f"the previous report {path} has no per-class acceptance")
    return by_class
