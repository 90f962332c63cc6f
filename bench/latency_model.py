"""Cost of the latency model per call: observe, predict, and the two together.

Two pools (one speculative) x 16 traffic classes, loads drawn from 0-300.
"predict (fitted)" reads a pair whose table is current. After an observation
the next prediction refits that pair's table, at most once per `refit_s` (0.1 s
by default) of its data: the rows "refit every time" set refit_s = 0, the
worst case. "observe + 2 predicts" is what a routed request costs (one answer,
one prediction per pool). "room" is admission's read of a candidate's room at
a 30 ms objective per token. `--kind dynamic` makes the drafting pool one that
stops drafting past 8 in flight, whose room is searched a stretch at a time.
Per call, in microseconds.

    python bench/latency_model.py [--calls 20000] [--kind dynamic]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from gateway.decide.latency import LatencyModel
from gateway.policy.kinds import PoolKind, schedule_of

POOLS = ("speculative", "standard")
CLASSES = tuple(f"{domain}/{bucket}" for domain in ("chat", "code", "math", "summarization")
                for bucket in ("greedy", "low", "mid", "hot"))


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(calls: int, step: Callable[[int], object]) -> list[float]:
    out = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        step(i)
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--kind", choices=("speculative", "dynamic"), default="speculative",
                        help="the drafting pool's kind (dynamic: 4 drafts up to 8 in flight, none past)")
    args = parser.parse_args()
    drafting = (schedule_of(PoolKind.SPECULATIVE, 3) if args.kind == "speculative"
                else schedule_of(PoolKind.DYNAMIC, 4, [[1, 8, 4], [9, 9, 0]]))
    rng = random.Random(3)
    picks = [(rng.choice(POOLS), rng.choice(CLASSES), rng.randrange(300), rng.uniform(0.05, 0.2),
              rng.uniform(0.005, 0.05)) for _ in range(args.calls)]
    print("| call | p50 µs | p99 µs | mean µs |")
    print("|---|---|---|---|")
    for refit_s, label in ((0.1, ""), (0.0, ", refit every time")):
        model = LatencyModel({"speculative": drafting}, refit_s=refit_s)
        for pool, cls, load, ttft, tpot in picks:  # warm: every pair has data and a fitted table
            model.observe(pool, cls, load, ttft, tpot)
        for pool, cls, load, _, _ in picks:
            model.predict(pool, cls, load, 256)
        for name, step in cases(model, picks):
            costs = timed(args.calls, step)
            print(f"| {name}{label} | {statistics.median(costs):.2f} | {percentile(costs, 0.99):.2f} | "
                  f"{statistics.fmean(costs):.2f} |")


def cases(model: LatencyModel, picks: list[tuple[str, str, int, float, float]]
          ) -> list[tuple[str, Callable[[int], object]]]:

    def observe(i: int) -> None:
        model.observe(*picks[i])

    def predict(i: int) -> None:
        model.predict(picks[i][0], picks[i][1], picks[i][2], 256)

    def observe_then_predict(i: int) -> None:
        model.observe(*picks[i])
        model.predict(picks[i][0], picks[i][1], picks[i][2], 256)

    def routed(i: int) -> None:
        pool, cls, load, ttft, tpot = picks[i]
        model.observe(pool, cls, load, ttft, tpot)
        for name in POOLS:
            model.predict(name, cls, load, 256)

    def estimate(i: int) -> None:
        model.estimate(picks[i][0], picks[i][1], picks[i][2], 256)

    def room(i: int) -> None:
        model.room(picks[i][0], picks[i][1], None, 0.03, 256, picks[i][2] + 1)

    return [("observe", observe), ("predict (fitted)", predict), ("observe + predict after it", observe_then_predict),
            ("observe + 2 predicts (a routed request)", routed), ("estimate with the slope (fitted)", estimate),
            ("room", room)]


if __name__ == "__main__":
    main()
