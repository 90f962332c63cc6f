"""Benchmark OpenAI-compatible endpoints: TTFT, TPOT, E2E, throughput per concurrency.

The benchmark itself, its interleaving and its plots: `specgate.ops.bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from specgate.ops.bench import plot, run_bench, served_model
from specgate.ops.prompts import builtin_prompts, load_prompts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", action="append", required=True, help="base URL (repeat to compare targets)")
    parser.add_argument("--prompts", help="JSONL prompts (default: a built-in mixed set)")
    parser.add_argument("--concurrency", default="1,8,32", help="levels, comma-separated (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=32, help="requests per level and target")
    parser.add_argument("--max-tokens", type=int, default=128, help="unless a prompt sets its own")
    parser.add_argument("--model", help="model name to send (default: the first model the first URL lists)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="directory for results and plots")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    levels = [int(level) for level in args.concurrency.split(",")]
    prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts()
    args.model = args.model or served_model(args.url[0])
    total = args.requests * len(levels) * len(args.url)
    with tqdm(total=total, unit="req", desc="bench") as bar:
        report = asyncio.run(run_bench(args.url, levels, args.requests, prompts, model=args.model,
                                       max_tokens=args.max_tokens, on_done=lambda sample: bar.update(1)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out)
    for row in report["results"]:
        tpot, e2e = row["tpot_s"]["p50"], row["e2e_s"]["p50"]
        print(f"{row['target']}  c={row['concurrency']:<4} tpot p50 {tpot * 1000 if tpot else float('nan'):7.1f} ms  "
              f"e2e p50 {e2e or float('nan'):6.2f} s  {row['output_tokens_per_s']:7.1f} tok/s  "
              f"errors {row['errors']}  pools {row['pools'] or '-'}")
    print(f"wrote {args.out / 'results.json'} and plots in {args.out}")
    return 0
