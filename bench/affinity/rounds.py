"""Interleaved runs of the arms and what is written after them, for both benchmarks.

Round r plays trace `seed + r` once per arm, the arms' order alternating from
one round to the next (A B, B A, ...), so a drift of the machine's load
during the benchmark falls on both arms alike.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.affinity import summary, trace
from bench.affinity.drive import Turn

Run = tuple[list[Turn], list[dict[str, float]], float]  # what `drive.play` returns
Runs = dict[str, list[Run]]  # by arm
PlayOne = Callable[[str, list[trace.Conversation], str], Run]  # (arm, conversations, label) -> one run


def interleaved(arms: list[str], rounds: int, shape: trace.TraceShape, seed: int,
                run_one: PlayOne) -> tuple[Runs, list[dict[str, Any]]]:  # fmt: skip
    """Every arm's runs, and one summary a run (with the 1-minute load average before and after)."""
    runs: Runs = {arm: [] for arm in arms}
    results: list[dict[str, Any]] = []
    for round_ in range(rounds):
        conversations = trace.make(shape, seed + round_)
        for arm in arms if round_ % 2 == 0 else arms[::-1]:
            load_before = os.getloadavg()[0]
            run = run_one(arm, conversations, f"round {round_ + 1} {arm}")
            runs[arm].append(run)
            load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            results.append({"round": round_ + 1, **summary.summarise(arm, *run), "load_average_1m": load})
            print(json.dumps(results[-1]), flush=True)
    return runs, results


def write(out: Path, name: str, setup: dict[str, Any], runs: Runs,
          results: list[dict[str, Any]], title: str) -> None:  # fmt: skip
    """`name`.json (the setup, every run, each arm pooled), `name`-ttft-by-turn.png, and the table."""
    pooled = [summary.pooled(arm, arm_runs) for arm, arm_runs in runs.items() if arm_runs]
    turns = {arm: [t for run in arm_runs for t in run[0]] for arm, arm_runs in runs.items()}
    samples = {arm: [[t.conversation, t.turn, t.ttft_s, t.error] for t in got] for arm, got in turns.items()}
    report = {**setup, "cpus": os.cpu_count(), "runs": results, "pooled": pooled, "turns": samples}
    (out / f"{name}.json").write_text(json.dumps(report, indent=2))
    summary.plot(turns, out / f"{name}-ttft-by-turn.png", title)
    print("\n".join([summary.HEADER, *map(summary.row, pooled)]))
