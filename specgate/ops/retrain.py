"""The report's retrain hint: which traffic classes the draft now serves badly.

Acceptance per class is the ratio of the increases of vLLM's accepted and
draft token counters over the period, summed by the Prometheus label that
carries the traffic class (`--class-label`, default `traffic_class`: give
each speculative deployment's scrape target that label, or relabel). Series
without the label are left out here (they still count in the report's
overall acceptance).

A class is named when it drafted at least `MIN_DRAFT_TOKENS` tokens in the
period and its acceptance is under the playbook's 0.55, or fell by more than
`--acceptance-drop` against the same class in a previous `report.json`
(`--previous`). For the named classes the hint is the capture-and-retrain
run: the policy's `capture` section (it samples every class: its one knob is
a share), then `specgate draft capture --class ...` keeping only those
classes, `specgate draft data` and `specgate draft train`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from gateway.control.signals.prometheus_api import PrometheusClient
from specgate.ops.weekly import ACCEPTED, DRAFTED, MIN_ACCEPTANCE, Period, series_selector

CLASS_LABEL = "traffic_class"
MIN_DRAFT_TOKENS = 1000  # fewer in the period: too little to judge the class
ACCEPTANCE_DROP = 0.10  # a fall larger than this against the previous report names the class


@dataclass(frozen=True)
class Fallen:
    traffic_class: str
    acceptance: float
    previous: float | None
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"class": self.traffic_class, "acceptance": self.acceptance, "previous": self.previous,
                "why": self.why}


async def acceptance_by_class(api: PrometheusClient, period: Period, match: str = "",
                              label: str = CLASS_LABEL) -> dict[str, dict[str, float]]:
    """`{class: {"acceptance": ..., "draft_tokens": ...}}` over the period."""
    accepted, drafted = series_selector(ACCEPTED, match), series_selector(DRAFTED, match)
    window = period.range

    async def by_class(promql: str) -> dict[str, float]:
        return {labels[label]: value for labels, value in await api.query(promql, period.end)
                if labels.get(label)}

    accepts = await by_class(f"sum by ({label}) (increase({accepted}[{window}]))")
    drafts = await by_class(f"sum by ({label}) (increase({drafted}[{window}]))")
    return {name: {"acceptance": accepts.get(name, 0.0) / count, "draft_tokens": count}
            for name, count in sorted(drafts.items()) if count > 0}


def read_by_class(url: str, period: Period, match: str = "", label: str = CLASS_LABEL,
                  timeout_s: float = 60.0) -> dict[str, dict[str, float]]:
    """Acceptance per class from the Prometheus at `url`; raises SignalError when it cannot be read."""
    async def read() -> dict[str, dict[str, float]]:
        async with aclosing(PrometheusClient(url, timeout_s=timeout_s)) as api:
            return await acceptance_by_class(api, period, match, label)

    return asyncio.run(read())


def fallen_classes(by_class: Mapping[str, Mapping[str, float]], previous: Mapping[str, Mapping[str, float]],
                   drop: float = ACCEPTANCE_DROP) -> list[Fallen]:
    """The classes to retrain for: under 0.55, or fallen by more than `drop`."""
    fallen = []
    for name, now in by_class.items():
        if now["draft_tokens"] < MIN_DRAFT_TOKENS:
            continue
        rate, before = now["acceptance"], previous.get(name, {}).get("acceptance")
        reasons = []
        if rate < MIN_ACCEPTANCE:
            reasons.append(f"under {MIN_ACCEPTANCE}")
        if before is not None and before - rate > drop:
            reasons.append(f"fell from {before:.3f} (more than {drop:.2f})")
        if reasons:
            fallen.append(Fallen(name, rate, before, "; ".join(reasons)))
    return fallen


def retrain_commands(classes: list[str]) -> dict[str, Any]:
    """The capture policy snippet and the commands that turn its prompts into a head."""
    policy = ("capture:\n  enabled: true\n  share: 0.02\n  directory: captured\n"
              "  retention_days: 14\n")
    only = " ".join(f"--class {name}" for name in classes)
    commands = [f"specgate draft capture --dir captured --out prompts.jsonl {only}",
                "specgate draft data --prompts prompts.jsonl --url STANDARD_POOL_URL --model MODEL --out draft-data",
                "specgate draft train --data draft-data --out draft-head"]
    return {"classes": classes, "policy": policy, "commands": commands}


def retrain_section(by_class: Mapping[str, Mapping[str, float]], fallen: list[Fallen], label: str) -> dict[str, Any]:
    """report.json's `retrain`: the measured classes, the named ones and the run."""
    section: dict[str, Any] = {"class_label": label, "by_class": dict(by_class),
                               "fallen": [item.to_json() for item in fallen]}
    if fallen:
        section.update(retrain_commands([item.traffic_class for item in fallen]))
    return section


def markdown(section: Mapping[str, Any]) -> list[str]:
    lines = ["", "## Acceptance by traffic class", ""]
    if not section["by_class"]:
        return lines + [f"No acceptance series carry the label `{section['class_label']}`."]
    lines += ["| class | acceptance | draft tokens |", "|---|---|---|"]
    lines += [f"| {name} | {row['acceptance']:.3f} | {row['draft_tokens']:.0f} |"
              for name, row in section["by_class"].items()]
    if not section["fallen"]:
        return lines + ["", "No class needs a new draft."]
    lines += ["", "## Retrain the draft for these classes", ""]
    lines += [f"- {item['class']}: acceptance {item['acceptance']:.3f}, {item['why']}" for item in section["fallen"]]
    lines += ["", "Capture their prompts (the policy samples every class; the export keeps these):", "",
              "```yaml", *section["policy"].splitlines(), "```", "",
              "then, after a few days of traffic, answer them with the target through the standard pool "
              "and train a head:", "", "```sh", *section["commands"], "```"]
    return lines
