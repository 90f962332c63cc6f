"""The statistics of a draft dataset: records, tokens and answer tokens in
all, per traffic class and per prompt source, and the percentiles of prompt
and answer lengths (`specgate draft stats`, and the end of `specgate draft data`).

A record's answer tokens are its loss-mask tokens (every assistant turn); its
prompt tokens are the rest (system and user turns, role headers).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from specgate.draft.dataset import Record

PERCENTILES = (50, 90, 99, 100)
UNKNOWN = "-"


def percentiles(values: list[int]) -> dict[str, int]:
    """Nearest-rank percentiles (p100 is the maximum); zeros when empty."""
    ordered = sorted(values)
    out = {}
    for p in PERCENTILES:
        out[f"p{p}"] = ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] if ordered else 0
    return out


def _group() -> dict[str, int]:
    return {"records": 0, "tokens": 0, "answer_tokens": 0}


def of(records: Iterable[Record]) -> dict[str, Any]:
    """The statistics of `records` (one pass)."""
    total = _group()
    by_class: dict[str, dict[str, int]] = {}
    by_source: dict[str, dict[str, int]] = {}
    prompt_lengths: list[int] = []
    answer_lengths: list[int] = []
    for record in records:
        answer = sum(record.loss_mask)
        prompt_lengths.append(len(record.input_ids) - answer)
        answer_lengths.append(answer)
        for group in (total, by_class.setdefault(record.traffic_class or UNKNOWN, _group()),
                      by_source.setdefault(record.source or UNKNOWN, _group())):
            group["records"] += 1
            group["tokens"] += len(record.input_ids)
            group["answer_tokens"] += answer
    return {**total, "by_class": dict(sorted(by_class.items())), "by_source": dict(sorted(by_source.items())),
            "prompt_tokens": percentiles(prompt_lengths), "answer_tokens_per_record": percentiles(answer_lengths)}


def render(stats: dict[str, Any]) -> str:
    """The statistics as aligned plain-text tables."""
    lines = [f"{stats['records']} records, {stats['tokens']} tokens, {stats['answer_tokens']} answer tokens"]
    for title, key in (("class", "by_class"), ("source", "by_source")):
        width = max([len(title), *map(len, stats[key])])
        lines.append(f"{title:<{width}}  {'records':>8}  {'tokens':>10}  {'answer tokens':>13}")
        for name, group in stats[key].items():
            lines.append(f"{name:<{width}}  {group['records']:>8}  {group['tokens']:>10}  {group['answer_tokens']:>13}")
    for title, key in (("prompt tokens", "prompt_tokens"), ("answer tokens", "answer_tokens_per_record")):
        lines.append(f"{title} per record: " + ", ".join(f"{p} {v}" for p, v in stats[key].items()))
    return "\n".join(lines)
