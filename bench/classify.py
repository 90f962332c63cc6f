"""Cost of domain classification and of the whole feature + routing step.

Classifies 4 KB prompts with the default policy's classifier (a prompt that
matches no domain is the worst case: every domain's pattern scans it) and
times `extract_features` + `decide` for a full request, per call.

    python bench/classify.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gateway.decide.features import extract_features
from gateway.decide.routing import cold_model, decide
from gateway.flags import FlagStore
from gateway.policy.loader import load_policy
from gateway.settings import default_policy_path

WORDS = ("river valley stone water mountain light quiet morning evening north wind field road city "
         "people story letter window garden bread music").split()


def prose(chars: int, rng: random.Random) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(WORDS))
    return " ".join(out)[:chars]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    policy = load_policy(default_policy_path())
    rng = random.Random(1)
    text = prose(4096, rng)
    prompts = {
        "chat (no match, worst case)": text,
        "code (match at the end)": text[:4000] + "\n```python\ndef f(x):\n    return x\n```",
        "math (match at the end)": text[:4060] + " solve 12 * 7 = ?",
    }
    flags = FlagStore(["speculative"]).snapshot()
    model = cold_model(policy)  # one, as the gateway keeps one: not a fresh one fitted per call
    print("| prompt (4 KB) | domain | classify p50 µs | classify p99 µs | features+decide p50 µs | p99 µs |")
    print("|---|---|---|---|---|---|")
    for name, prompt in prompts.items():
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": 256, "stream": True}
        classify, route = [], []
        for _ in range(args.calls):
            t0 = time.perf_counter_ns()
            domain = policy.classifier(prompt)
            t1 = time.perf_counter_ns()
            features = extract_features(body, "chat", policy.defaults, policy.classifier, {"speculative": 2})
            decide(features, policy, flags, 0.5, model)
            t2 = time.perf_counter_ns()
            classify.append((t1 - t0) / 1000)
            route.append((t2 - t1) / 1000)
        print(f"| {name} | {domain} | {statistics.median(classify):.1f} | {percentile(classify, 0.99):.1f} | "
              f"{statistics.median(route):.1f} | {percentile(route, 0.99):.1f} |")


if __name__ == "__main__":
    main()
