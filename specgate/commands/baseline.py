"""Record a latency baseline (TTFT, TPOT, E2E p50/p95) for the guard to compare against.

Measure the standard pool (or today's deployment) before turning speculation
on; point the policy's `guard.baseline_file` at the result.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime, timezone
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    record = sub.add_parser("record", help="measure a URL and write the baseline JSON")
    record.add_argument("--url", required=True, help="base URL of the OpenAI-compatible server")
    record.add_argument("--prompts", help="JSONL prompts (default: the built-in mixed set)")
    record.add_argument("--requests", type=int, default=32)
    record.add_argument("--concurrency", type=int, default=1)
    record.add_argument("--max-tokens", type=int, default=128)
    record.add_argument("--model", help="model name to send (default: the first one the URL lists)")
    record.add_argument("--out", type=Path, default=Path("baseline.json"))


def run(args: argparse.Namespace) -> int:
    from gateway.control.baseline import Baseline, Percentiles, write_baseline
    from specgate.ops.bench import run_bench, served_model
    from specgate.ops.prompts import builtin_prompts, load_prompts

    prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts()
    args.model = args.model or served_model(args.url)
    report = asyncio.run(run_bench([args.url], [args.concurrency], args.requests, prompts, model=args.model,
                                   max_tokens=args.max_tokens))
    row = report["results"][0]
    if row["errors"] == row["requests"]:
        print(f"specgate baseline: every request to {args.url} failed; no baseline written", file=sys.stderr)
        return 1

    def pair(name: str) -> Percentiles:
        return Percentiles(p50=row[name]["p50"] or 0.0, p95=row[name]["p95"] or 0.0)

    baseline = Baseline(url=args.url, model=args.model, recorded_at=datetime.now(timezone.utc),
                        requests=row["requests"] - row["errors"], ttft_s=pair("ttft_s"), tpot_s=pair("tpot_s"),
                        e2e_s=pair("e2e_s"))
    write_baseline(args.out, baseline)
    print(f"wrote {args.out}: TTFT p50 {baseline.ttft_s.p50 * 1000:.1f} ms, TPOT p50 "
          f"{baseline.tpot_s.p50 * 1000:.1f} ms, E2E p50 {baseline.e2e_s.p50:.2f} s ({row['errors']} errors)")
    return 0
