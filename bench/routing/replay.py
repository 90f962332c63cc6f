"""Replay one mixed request trace three ways and compare: everything to the
speculative pool, everything to the standard pool, and through the gateway.

The trace (seeded) mixes temperatures 0-1.5, max_tokens 16-1024, streamed and
non-streamed requests, chat/code/math prompts, and bursts that push
concurrency well past 8. Requests are sent open-loop at their arrival times.
Reported per way: mean and p95 E2E latency and goodput, the requests per
second that met the latency SLO of `--slo-ms` per output token
(E2E / output tokens, so streamed and non-streamed requests count alike).

GPU scale, with the calibrated pool simulator (docs/sim.md):
    python bench/routing/replay.py --sim
On real backends already running (e.g. `specgate up`):
    python bench/routing/replay.py --speculative URL --standard URL --gateway URL --requests 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specgate.ops.measure import Sample, percentile, timed_request  # noqa: E402 - importable once the root is on sys.path
from specgate.ops.prompts import Prompt, prompt_from, user  # noqa: E402 - importable once the root is on sys.path

TEXTS = {
    "chat": ["Tell me about the history of tea.", "How do I plan a week of healthy meals?"],
    "code": ["Write a Python function that merges two sorted lists.\n```python\ndef merge(a, b):\n```",
             "Refactor this loop into a list comprehension:\n"
             "```python\nout = []\nfor x in xs:\n    out.append(x * 2)\n```"],
    "math": ["Solve 12 * 7 = ? and explain.", "Prove that the sum of two even numbers is even."],
}


def make_trace(count: int, seed: int, duration_s: float) -> list[tuple[float, Prompt, bool]]:
    """(arrival time, prompt, stream) triples: a steady trickle plus bursts."""
    rng = random.Random(seed)
    arrivals = sorted(rng.uniform(0, duration_s) for _ in range(count // 2))
    for burst_at in (duration_s * 0.25, duration_s * 0.6):  # two bursts of simultaneous arrivals
        arrivals += [burst_at + rng.uniform(0, 1.0) for _ in range((count - len(arrivals)) // 2 or 1)]
    arrivals += [rng.uniform(0, duration_s) for _ in range(count - len(arrivals))]
    trace = []
    for at in sorted(arrivals)[:count]:
        domain = rng.choice(list(TEXTS))
        max_tokens = int(round(2 ** rng.uniform(4, 10)))  # 16 .. 1024, log-uniform
        temperature = rng.choice([0.0, 0.0, 0.3, 0.7, 1.0, 1.2, 1.5])
        trace.append((at, user(rng.choice(TEXTS[domain]), max_tokens=max_tokens, temperature=temperature,
                               domain=domain), rng.random() < 0.7))
    return trace


def write_trace(trace: list[tuple[float, Prompt, bool]], path: Path) -> None:
    """One JSON object per request: arrival time (s from the start), stream, and the prompt fields."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for at, prompt, stream in trace:
            out.write(json.dumps({"at": at, "stream": stream, "messages": list(prompt.messages),
                                  "max_tokens": prompt.max_tokens, "temperature": prompt.temperature,
                                  "domain": prompt.domain}) + "\n")


def read_trace(path: Path) -> list[tuple[float, Prompt, bool]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(row["at"], prompt_from(row), row["stream"]) for row in rows]


async def replay(
    url: str, trace: list[tuple[float, Prompt, bool]], model: str, name: str
) -> tuple[list[Sample], float]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=1000), trust_env=False) as client:
        started = time.perf_counter()

        async def fire(at: float, prompt: Prompt, stream: bool) -> Sample:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
            return await timed_request(client, url, prompt, model=model, max_tokens=256, target=name,
                                       concurrency=0, stream=stream)

        samples = await asyncio.gather(*(fire(*item) for item in trace))
        return list(samples), time.perf_counter() - started


def report(name: str, samples: list[Sample], wall_s: float, slo_s: float) -> dict:
    ok = [s for s in samples if s.ok and s.output_tokens]
    e2e = [s.e2e_s for s in ok]
    good = [s for s in ok if s.e2e_s / s.output_tokens <= slo_s]
    pools: dict[str, int] = {}
    for sample in ok:
        pools[sample.pool or name] = pools.get(sample.pool or name, 0) + 1
    return {"way": name, "requests": len(samples), "errors": len(samples) - len(ok),
            "e2e_mean_s": statistics.fmean(e2e) if e2e else None, "e2e_p95_s": percentile(e2e, 95),
            "goodput_rps": len(good) / wall_s, "met_slo": len(good), "wall_s": wall_s, "pools": pools}


def start_sims(work: Path, time_scale: float, busy: int | None) -> tuple[list[subprocess.Popen], dict[str, str]]:
    from tests.fakes.process import free_port

    procs, urls = [], {}
    for kind in ("speculative", "standard"):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "specgate.cli", "sim", "--kind", kind, "--port", str(port),
                                       "--time-scale", str(time_scale), "--seed", "1"], cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls[kind] = f"http://127.0.0.1:{port}"
    policy = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    for kind in ("speculative", "standard"):
        policy["pools"][kind]["endpoints"] = [{"url": urls[kind]}]
        policy["pools"][kind]["model"] = "specgate-sim"
        policy["pools"][kind]["max_in_flight"] = 1024
    if busy is not None:  # calibrate the batch-pressure rule to the pool's measured crossover
        rule = next(r for r in policy["rules"] if r["name"] == "busy")
        rule["when"] = {"load.speculative": {"ge": busy}}
    (work / "policy.yaml").write_text(yaml.safe_dump(policy))
    port = free_port()
    procs.append(subprocess.Popen([sys.executable, "-m", "specgate.cli", "serve", "--policy", str(work / "policy.yaml"),
                                   "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=(work / "gateway.log").open("w")))
    urls["gateway"] = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    for url, path in ((urls["speculative"], "/health"), (urls["standard"], "/health"), (urls["gateway"], "/readyz")):
        while True:
            try:
                if httpx.get(url + path, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not start")
            time.sleep(0.2)
    return procs, urls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="start two pool simulators and a gateway")
    parser.add_argument("--speculative"), parser.add_argument("--standard"), parser.add_argument("--gateway")
    parser.add_argument("--model", default="specgate-sim")
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds the trace's arrivals span")
    parser.add_argument("--slo-ms", type=float, default=25.0, help="latency SLO per output token")
    parser.add_argument("--time-scale", type=float, default=1.0, help="sim only: 1.0 is modelled GPU speed")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--busy", type=int, help="sim only: the default policy's busy threshold instead of 8")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "routing.json")
    parser.add_argument("--trace", type=Path, help="replay this JSONL trace instead of generating one")
    parser.add_argument("--trace-out", type=Path, default=ROOT / "bench" / "out" / "routing-trace.jsonl",
                        help="where the generated trace is written")
    args = parser.parse_args()
    procs: list[subprocess.Popen] = []
    if args.sim:
        procs, urls = start_sims(Path(tempfile.mkdtemp(prefix="specgate-routing-")), args.time_scale, args.busy)
    else:
        urls = {"speculative": args.speculative, "standard": args.standard, "gateway": args.gateway}
    if args.trace:
        trace = read_trace(args.trace)
    else:
        write_trace(make_trace(args.requests, args.seed, args.duration), args.trace_out)
        trace = read_trace(args.trace_out)  # replay exactly what the file holds
    results = []
    try:
        for name in ("speculative", "standard", "gateway"):
            samples, wall = asyncio.run(replay(urls[name], trace, args.model, name))
            results.append(report(name, samples, wall, args.slo_ms / 1000))
            print(json.dumps(results[-1]), flush=True)
    finally:
        for proc in procs:
            proc.terminate()
    best_static = max(results[:2], key=lambda r: r["goodput_rps"])
    gateway = results[2]
    summary = {"trace": {"requests": len(trace), "file": str(args.trace or args.trace_out), "seed": args.seed},
               "busy_threshold": args.busy or 8,
               "slo_ms_per_token": args.slo_ms, "results": results,
               "gateway_goodput_gain_over_best_static": gateway["goodput_rps"] / best_static["goodput_rps"] - 1
               if best_static["goodput_rps"] else None,
               "gateway_mean_e2e_vs_best_static": gateway["e2e_mean_s"] / min(r["e2e_mean_s"] for r in results[:2])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print("| way | requests | errors | mean E2E s | p95 E2E s | goodput req/s | met SLO | pools |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['way']} | {r['requests']} | {r['errors']} | {r['e2e_mean_s']:.2f} | {r['e2e_p95_s']:.2f} | "
              f"{r['goodput_rps']:.2f} | {r['met_slo']} | {r['pools']} |")
    print(f"gateway goodput vs the better static choice ({best_static['way']}): "
          f"{summary['gateway_goodput_gain_over_best_static']:+.1%}; mean E2E ratio "
          f"{summary['gateway_mean_e2e_vs_best_static']:.2f}")


if __name__ == "__main__":
    main()
