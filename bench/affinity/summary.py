"""What one run measured, and the table and plot of several runs.

TTFT p50 and p95 on first turns and on later turns; the prefix-cache hit rate
(hits over queries, both in prompt tokens, from the backends' counters); and
each replica's load: finished requests, and mean requests in flight (the sum
of their latencies over the wall time). The busiest replica's load over the
mean says how even the pool was kept.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.affinity.drive import Turn


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ttft_ms(turns: Sequence[Turn], later: bool) -> dict[str, float | None]:
    chosen = [t.ttft_s * 1000 for t in turns if t.ok and t.ttft_s is not None and (t.turn >= 2) == later]
    p50, p95 = percentile(chosen, 0.5), percentile(chosen, 0.95)
    return {"n": len(chosen), "p50": p50 and round(p50, 1), "p95": p95 and round(p95, 1)}


def load_ratio(values: Sequence[float]) -> float | None:
    mean = statistics.fmean(values) if values else 0.0
    return round(max(values) / mean, 3) if mean > 0 else None


def summarise(arm: str, turns: Sequence[Turn], deltas: Sequence[dict[str, float]], wall: float) -> dict[str, Any]:
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in deltas)
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in deltas)
    requests = [d["vllm:e2e_request_latency_seconds_count"] for d in deltas]
    in_flight = [d["vllm:e2e_request_latency_seconds_sum"] / wall for d in deltas]
    return {
        "arm": arm, "turns": len(turns), "errors": sum(not t.ok for t in turns), "wall_s": round(wall, 1),
        "error_kinds": dict(Counter(t.error.split(":")[0] for t in turns if not t.ok)),
        "ttft_turn1_ms": ttft_ms(turns, later=False), "ttft_later_ms": ttft_ms(turns, later=True),
        "hit_rate": round(hits / queries, 3) if queries else None,
        "replica_requests": [int(r) for r in requests], "replica_in_flight": [round(f, 2) for f in in_flight],
        "busiest_requests_over_mean": load_ratio(requests), "busiest_in_flight_over_mean": load_ratio(in_flight),
    }  # fmt: skip


def pooled(arm: str, runs: Sequence[tuple[list[Turn], list[dict[str, float]], float]]) -> dict[str, Any]:
    """One summary of several runs of an arm: the turns pooled, the counters and wall times added."""
    turns = [turn for run in runs for turn in run[0]]
    wall = sum(run[2] for run in runs)
    deltas = [{name: sum(run[1][i][name] for run in runs) for name in runs[0][1][i]} for i in range(len(runs[0][1]))]
    return summarise(arm, turns, deltas, wall)


HEADER = ("| arm | turns (errors) | TTFT turn 1 p50 / p95 ms | TTFT turns >= 2 p50 / p95 ms | hit rate "
          "| busiest / mean: requests, in flight |\n|---|---|---|---|---|---|")  # fmt: skip


def row(result: dict[str, Any]) -> str:
    first, later = result["ttft_turn1_ms"], result["ttft_later_ms"]
    return (f"| {result['arm']} | {result['turns']} ({result['errors']}) | {first['p50']} / {first['p95']} "
            f"| {later['p50']} / {later['p95']} | {result['hit_rate']} "
            f"| {result['busiest_requests_over_mean']}x, {result['busiest_in_flight_over_mean']}x |")  # fmt: skip


def plot(by_arm: dict[str, list[Turn]], path: Path, title: str) -> None:
    """TTFT p50 by turn number, one line an arm (turns seen fewer than 5 times left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(6, 3.6))
    for arm, turns in by_arm.items():
        numbers = sorted({t.turn for t in turns})
        points = []
        for number in numbers:
            values = [t.ttft_s * 1000 for t in turns if t.turn == number and t.ok and t.ttft_s is not None]
            if len(values) >= 5:
                points.append((number, statistics.median(values)))
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=arm)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("turn of the conversation")
    axes.set_ylabel("TTFT p50 (ms)")
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
