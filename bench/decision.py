"""Cost of the whole routing decision per request, admission included.

What the gateway computes before it sends a request anywhere, with the shipped
default policy (`route: fastest` over the speculative and standard pools):
the body's features (prompt, domain, temperature, load), the rules, each
candidate's predicted E2E and cost to the fleet from a latency model that has
measured every pool and class (tables fitted, as on a busy gateway), the
Thompson draw, and the admission verdict. Timed twice: with the shipped pools
at loads 0-300 (their `slo`, 50 ms a token: each loaded candidate's room is
read, and at most loads some candidate has room, so the verdict is "admit")
and with `slo: {tpot_s: 0.02}` on both pools at loads where every candidate is
past it, where the decision searches each loaded candidate's room on its
curve and the verdict is a hold.

Loads are drawn from 0-300 per pool per call; prompts are short chat turns,
a short code turn and 4 KB documents, each at temperatures 0, 0.7 and 1.3.
Per call, in microseconds of the thread's CPU time (a loaded machine inflates
wall-clock samples with time spent descheduled; CPU time is what an idle
machine's wall clock would show, less cache effects). Rows: the features
(parse the body's fields, classify the prompt), then the decision on them
(rules, each candidate's prediction and cost, the draw), then admission's
verdict, each with the clock read between them; then the three together,
timed as one in a second pass (a read of the thread's clock costs ~0.35 µs
on a VM, and the parts' reads would count in the whole). A second table
gives that pass's p50 per prompt: a third of the calls are 4 KB documents,
so the mix's p50 is the short prompts' 75th percentile.

The calls run in rounds, each bracketed by a fixed pure-Python loop timed the
same way. A shared host switches between speeds (up to 1.7x apart, for tenths
of a second to seconds, whatever runs); a third table gives each round's p50s
beside the loop's, so a reader sees which rounds ran on the quiet host: the
fastest rounds are the code's own cost, the rest the host's.

    python bench/decision.py [--calls 20000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from typing import Any

from gateway.decide.admission import hold
from gateway.decide.features import extract_features
from gateway.decide.latency import LatencyModel, LatencyPriors
from gateway.decide.routing import decide
from gateway.flags import FlagStore
from gateway.policy.classes import traffic_class
from gateway.policy.compiled import Policy
from gateway.policy.loader import load_policy
from gateway.policy.priors import SloSpec
from gateway.settings import default_policy_path

WORDS = ("river valley stone water mountain light quiet morning evening north wind field road city "
         "people story letter window garden bread music").split()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def warmed(policy: Policy, rng: random.Random) -> LatencyModel:
    """A model that has seen answers of every pool and class at loads 1-256, as a busy gateway has."""
    routing = policy.spec.routing
    model = LatencyModel(policy.schedules, LatencyPriors(routing.priors), half_life_s=routing.half_life_s)
    domains = (*policy.spec.domains, policy.spec.default_domain)
    for _ in range(4000):
        pool = rng.choice(list(policy.pools))
        cls = traffic_class(rng.choice(domains), rng.choice((0.0, 0.3, 0.8, 1.3)))
        load = rng.randint(1, 256)
        per_step = 2.0 if pool in policy.speculative_pools else None
        model.observe(pool, cls, load, 0.05 + load * 1e-4, 0.02 + load * 5e-5, per_step=per_step)
    return model


PROMPTS = ("a short chat turn", "a 4 KB document", "a short code turn")  # bodies' order, three temperatures each


def bodies(rng: random.Random) -> list[dict[str, Any]]:
    document = " ".join(rng.choice(WORDS) for _ in range(700))[:4096]
    short = "What should I plant in a small garden in the north?"
    out = []
    for prompt in (short, document, "```python\ndef f(x):\n    return x\n```\nrefactor this"):
        for temperature in (0.0, 0.7, 1.3):
            out.append({"model": "m", "messages": [{"role": "user", "content": prompt}],
                        "temperature": temperature, "max_tokens": 256, "stream": True})
    return out


def stated(policy: Policy) -> str:
    """The pools' objectives in a table cell: `tpot_s 0.05`, or `none`."""
    slos = {" ".join(f"{key} {value:g}" for key, value in slo.model_dump(exclude_none=True).items())
            for slo in policy.objectives.values()}
    return ", ".join(sorted(slos)) or "none"


def with_slo(policy: Policy, tpot_s: float) -> Policy:
    """The policy with `slo: {tpot_s}` on every pool: routing reads each candidate's room."""
    pools = {name: spec.model_copy(update={"slo": SloSpec(tpot_s=tpot_s)}) for name, spec in policy.pools.items()}
    return dataclasses.replace(policy, spec=policy.spec.model_copy(update={"pools": pools}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="decisions per row and pass, over all rounds")
    parser.add_argument("--rounds", type=int, default=9, help="rounds the calls are split into, each "
                        "bracketed by the host's reference loop")
    args = parser.parse_args()
    if args.calls < 1 or not 1 <= args.rounds <= args.calls:
        parser.error("--calls >= 1 and 1 <= --rounds <= --calls")
    policy = load_policy(default_policy_path())
    rng = random.Random(1)
    model = warmed(policy, rng)
    flags = FlagStore(list(policy.speculative_pools)).snapshot()
    requests = bodies(rng)
    draw = random.Random(2)
    rows = [Row(name, slo, judged, [{pool: rng.randint(low, 300) for pool in policy.pools} for _ in range(1024)])
            for name, low, judged, slo in (("0-300", 0, policy, f"shipped: {stated(policy)}"),
                                           ("200-300", 200, with_slo(policy, 0.02),
                                            "tpot_s 0.02, every pool past it"))]
    per_round = []
    for r in range(args.rounds):
        calls = range(r * args.calls // args.rounds, (r + 1) * args.calls // args.rounds)
        before = reference_loop()
        for row in rows:
            timed_parts(row, calls, requests, policy, flags, model, draw)
            whole = timed_whole(row, calls, requests, policy, flags, model, draw)
            row.whole.extend(whole)
            row.rounds.append((calls.start, whole))
        per_round.append((before, reference_loop()))
    print("| loads | pools' slo | features p50 | decide p50 | admission p50 | all p50 µs | all p90 µs | all p99 µs |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row.name} | {row.slo} | " + " | ".join(f"{statistics.median(row.parts[p]):.1f}" for p in row.parts)
              + f" | {statistics.median(row.whole):.1f} | {percentile(row.whole, 0.9):.1f} "
              f"| {percentile(row.whole, 0.99):.1f} |")
    print_by_prompt([(row.name, row.slo, by_kind(row.whole, len(requests))) for row in rows])
    print_rounds(per_round, rows, len(requests))


@dataclasses.dataclass
class Row:
    """One of the table's rows: the loads drawn and the policy judged, and its samples."""
    name: str
    slo: str
    judged: Policy
    loads: list[dict[str, int]]
    parts: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {"features": [], "decide": [], "admission": []})
    whole: list[float] = dataclasses.field(default_factory=list)
    rounds: list[tuple[int, list[float]]] = dataclasses.field(default_factory=list)  # (first call, samples)


def timed_parts(row: Row, calls: range, requests: list[dict[str, Any]], policy: Policy, flags: Any,
                model: LatencyModel, draw: random.Random) -> None:
    """Each part timed on its own, into `row.parts`."""
    for i in calls:
        body, load = requests[i % len(requests)], row.loads[i % len(row.loads)]
        t0 = time.thread_time_ns()
        features = extract_features(body, "chat", policy.defaults, policy.classifier, load)
        t1 = time.thread_time_ns()
        found = decide(features, row.judged, flags, draw.random(), model, draw).fastest
        t2 = time.thread_time_ns()
        if found is not None:
            hold(found, row.judged.objectives, ahead=i % 4)
        t3 = time.thread_time_ns()
        for samples, ns in zip(row.parts.values(), (t1 - t0, t2 - t1, t3 - t2), strict=True):
            samples.append(ns / 1000)


def timed_whole(row: Row, calls: range, requests: list[dict[str, Any]], policy: Policy, flags: Any,
                model: LatencyModel, draw: random.Random) -> list[float]:
    """The three parts again, timed as one: the clock reads between the parts cost ~0.35 us each."""
    whole = []
    for i in calls:
        body, load = requests[i % len(requests)], row.loads[i % len(row.loads)]
        t0 = time.thread_time_ns()
        features = extract_features(body, "chat", policy.defaults, policy.classifier, load)
        found = decide(features, row.judged, flags, draw.random(), model, draw).fastest
        if found is not None:
            hold(found, row.judged.objectives, ahead=i % 4)
        whole.append((time.thread_time_ns() - t0) / 1000)
    return whole


def reference_loop(repeats: int = 1000) -> float:
    """The p50 of a fixed pure-Python loop, in µs: the host's speed at that moment. Shared
    hosts switch between speeds (this one by up to 1.7x, for tenths of a second to seconds),
    and a round's decision costs are read beside the loop's time around them."""
    samples = []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        total = 0
        for i in range(300):
            total += i * i
        samples.append((time.thread_time_ns() - t0) / 1000)
    return statistics.median(samples)


def by_kind(whole: list[float], bodies: int, first: int = 0) -> list[float]:
    """The whole decision's p50 per prompt of PROMPTS: over the mix, a third of the calls are
    4 KB documents, so the mix's p50 is the short prompts' 75th percentile. `first`: the
    call the samples start at."""
    per = len(PROMPTS)
    kinds: list[list[float]] = [[] for _ in PROMPTS]
    for i, us in enumerate(whole, first):
        kinds[(i % bodies) * per // bodies].append(us)
    return [statistics.median(kind) for kind in kinds]


def print_rounds(per_round: list[tuple[float, float]], rows: list[Row], bodies: int) -> None:
    """Per round: the host's reference loop before and after it, and each row's whole decision,
    over the mix (p50) and per prompt. The fastest rounds are the code's cost on a quiet host."""
    columns = [f"{row.name}: {what}" for row in rows for what in ("mix p50 µs", *PROMPTS)]
    print("\n| round | host loop µs before, after | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for r, (before, after) in enumerate(per_round, 1):
        cells = []
        for row in rows:
            first, samples = row.rounds[r - 1]
            cells.append(f"{statistics.median(samples):.1f}")
            cells.extend(f"{m:.1f}" for m in by_kind(samples, bodies, first))
        print(f"| {r} | {before:.1f}, {after:.1f} | " + " | ".join(cells) + " |")


def print_by_prompt(rows: list[tuple[str, str, list[float]]]) -> None:
    print("\n| loads | pools' slo | " + " | ".join(f"{prompt} p50 µs" for prompt in PROMPTS) + " |")
    print("|---|---|" + "---|" * len(PROMPTS))
    for name, slo, medians in rows:
        print(f"| {name} | {slo} | " + " | ".join(f"{m:.1f}" for m in medians) + " |")


if __name__ == "__main__":
    main()
