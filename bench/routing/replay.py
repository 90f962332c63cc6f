"""Replay seeded request traces against the same hardware served four ways.

Two simulated replicas per way (backends/sim, docs/sim.md), always behind the
same gateway: the gateway routing `policies/default.yaml` over one speculative
and one standard replica, and three baselines that put both replicas of one
kind in a single pool with a fixed route: 2x speculative, 2x standard, 2x
dynamic (the engines' own speculation switch). bench/routing/stack.py starts
them, bench/routing/traces.py says what each trace holds, and
bench/routing/outcome.py what is measured.

    python bench/routing/replay.py --sim --traces light,bursty,collapse,shift
    python bench/routing/replay.py --sim --trace bench/out/routing/collapse.jsonl

Real vLLM CPU replicas (bench/routing/vllm_stack.py), the ways 2x speculative,
gateway, 2x standard, 2x dynamic, replicas kept between ways where the kind allows:
    python bench/routing/replay.py --vllm --traces copy-chat --requests 45 --duration 150 --slo-ms 100

On backends already running (no control events, no simulators started):
    python bench/routing/replay.py --speculative URL --standard URL --gateway URL --model smollm2 \
        --traces mixed --requests 24 --duration 20 --slo-ms 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from backends.model import prepare  # noqa: E402 - as below
from bench.routing import outcome, stack, traces, vllm_stack  # noqa: E402 - importable once the root is on sys.path
from specgate.up import Service  # noqa: E402 - as above

OUT = ROOT / "bench" / "out" / "routing"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="start two simulated replicas and a gateway per way")
    parser.add_argument("--speculative"), parser.add_argument("--standard"), parser.add_argument("--gateway")
    parser.add_argument("--vllm", action="store_true", help="start real vLLM CPU replicas and a gateway per way")
    parser.add_argument("--check", type=int, default=6, help="vllm only: copy prompts timed on each kind alone")
    parser.add_argument("--ways", help="sim or vllm: which ways, in this order (default: all of them)")
    parser.add_argument("--traces", default="light,bursty,collapse,shift", help=f"of {', '.join(traces.KINDS)}")
    parser.add_argument("--trace", type=Path, help="replay this JSONL trace instead of generating any")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--requests", type=int, default=240, help="the mixed trace only")
    parser.add_argument("--duration", type=float, default=60.0, help="the mixed trace only: seconds it spans")
    parser.add_argument("--slo-ms", type=float, default=25.0, help="latency SLO per output token")
    parser.add_argument("--tight-slo-ms", type=float, default=15.0, help="a second, tighter SLO per output token")
    parser.add_argument("--time-scale", type=float, default=1.0, help="sim only: 1.0 is modelled GPU speed")
    parser.add_argument("--sim-arg", action="append", default=[], help="sim only: passed to every `specgate sim`")
    parser.add_argument("--model", default=stack.MODEL)
    parser.add_argument("--gateway-policy", type=Path, help="sim only: the gateway way's policy (default: "
                        "policies/default.yaml); one simulator of its pool's kind per endpoint it lists")
    parser.add_argument("--out", type=Path, default=OUT, help="where traces and results are written")
    return parser.parse_args()


def run_way(args: argparse.Namespace, way: str, trace: traces.Trace, work: Path,
            replicas: vllm_stack.Replicas | None) -> dict[str, Any]:
    running: stack.Stack | Service | None
    sims: list[str] = []
    gateway = yaml.safe_load(args.gateway_policy.read_text()) if args.gateway_policy else stack.default_policy()
    if replicas is not None:
        url, running = vllm_way(args, way, trace, work, replicas)
    elif args.sim:
        sim_args = [part for arg in args.sim_arg for part in arg.split()]
        running = stack.start(way, work, args.time_scale, sim_args, gateway)
        url, sims = running.url, running.sims
    else:
        running, url = None, getattr(args, way)
    decisions = None
    try:
        samples, wall = asyncio.run(outcome.replay(url, trace, sims, args.model, way))
        if way == "gateway":
            decisions = outcome.decisions(url)
    finally:
        if running:
            running.stop()
    result = outcome.report(way, trace, samples, wall, args.slo_ms / 1000,
                            args.tight_slo_ms / 1000, stack.drafting_pools(gateway))
    if decisions is not None:
        result.update(decisions)
    (args.out / f"{trace.name}-{way}-requests.json").write_text(json.dumps(outcome.requests(trace, samples)))
    return result


def vllm_way(args: argparse.Namespace, way: str, trace: traces.Trace, work: Path,
             replicas: vllm_stack.Replicas) -> tuple[str, Service]:
    """The way's vLLM replicas (kept or started), then its gateway; before the gateway way,
    with one replica of each kind up, the n-gram speed-up on the trace's copy prompts."""
    if way not in vllm_stack.VLLM_WAYS:
        raise SystemExit(f"--vllm: no way {way!r}; the ways are {', '.join(vllm_stack.VLLM_WAYS)}")
    urls = replicas.serve(stack.WAYS[way])
    copies = [r for r in trace.requests if r.prompt.domain == "copy"][:args.check]
    if way == "gateway" and copies:
        check = vllm_stack.check_speedup(dict(zip(stack.WAYS[way], urls, strict=True)), copies, args.model)
        print(json.dumps({"speedup_check_ms_per_token": check}), flush=True)
        (args.out / f"{trace.name}-speedup-check.json").write_text(json.dumps(check))
    return vllm_stack.start_gateway(way, urls, work)


def chosen_ways(args: argparse.Namespace) -> list[str]:
    if args.ways:
        return list(args.ways.split(","))
    if args.vllm:
        return list(vllm_stack.VLLM_WAYS)
    return list(stack.WAYS) if args.sim else [w for w in ("speculative", "standard", "gateway") if getattr(args, w)]


def run_trace(args: argparse.Namespace, trace: traces.Trace, path: Path, work: Path,
              replicas: vllm_stack.Replicas | None) -> list[dict[str, Any]]:
    results = []
    for way in chosen_ways(args):
        results.append(run_way(args, way, trace, work, replicas))
        print(json.dumps(results[-1]), flush=True)
    best = max((r for r in results if r["way"] != "gateway"), key=lambda r: r["goodput_rps"], default=None)
    summary = {"trace": trace.name, "file": str(path), "seed": args.seed, "requests": len(trace.requests),
               "slo_ms_per_token": args.slo_ms,
               "tight_slo_ms_per_token": args.tight_slo_ms, "time_scale": args.time_scale, "sim_args": args.sim_arg,
               "results": results, "best_baseline": best and best["way"]}
    (args.out / f"{trace.name}.json").write_text(json.dumps(summary, indent=2))
    return results


def main() -> None:
    args = arguments()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="specgate-routing-"))
    if args.trace:
        chosen = [(traces.read(args.trace), args.trace)]
    else:
        chosen = []
        for kind in args.traces.split(","):
            path = args.out / f"{kind}.jsonl"
            traces.write(traces.make(kind, args.seed, args.requests, args.duration), path)
            chosen.append((traces.read(path), path))  # replay exactly what the file holds
    print(f"gateway logs and policies: {work}", flush=True)
    table = [outcome.HEADER]
    replicas = vllm_stack.Replicas(prepare(), work) if args.vllm else None
    try:
        for trace, path in chosen:
            table += [outcome.row(trace.name, result) for result in run_trace(args, trace, path, work, replicas)]
    finally:
        if replicas is not None:
            replicas.stop()
    print("\n".join(table))


if __name__ == "__main__":
    main()
