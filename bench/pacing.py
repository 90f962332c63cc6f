"""Even streams: what pacing does to a speculative pool's cadence and latency.

One simulated speculative pool (`specgate sim`, docs/sim.md: modelled GPU
step times, a random number of accepted draft tokens per step) behind two
gateways that differ only in the pool's `pacing` (off, on), and a simulated
standard pool behind a third for reference. All three are loaded at once with
the same streamed chat requests, so machine noise hits them alike. At the
client it measures, per way: the gaps between content events (p50, p95, max,
coefficient of variation) and between tokens as a reader sees them (the
tokens of one event arrive together; the client asks for the running count
to know them), tokens per event, the share of tokens that come within 1 ms of the one
before (as one burst), TTFT and E2E, and what pacing added to TTFT and E2E.

    python bench/pacing.py --requests 60 --concurrency 4 --max-tokens 128 --max-delay-ms 150
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.process import free_port, spawn_module, wait_until_ok  # noqa: E402 - importable once the root is on sys.path

MODEL = "sim"
TOGETHER_S = 0.001  # a token this soon after the one before it appears with it
PROMPTS = ["Tell me a story about a lighthouse keeper.", "Explain how a bicycle stays upright.",
           "Write a short letter to a friend about spring.", "Describe a busy market in the morning."]


@dataclass
class Stream:
    ttft_s: float
    e2e_s: float
    events: list[tuple[float, int]]  # each content event: when it arrived, how many tokens it carried

    def event_gaps(self) -> list[float]:
        return [b[0] - a[0] for a, b in zip(self.events, self.events[1:], strict=False)]

    def token_gaps(self) -> list[float]:
        """Gaps between tokens as a reader sees them: the tokens of one event arrive together."""
        times = [at for at, tokens in self.events for _ in range(max(1, tokens))]
        return [b - a for a, b in zip(times, times[1:], strict=False)]


@dataclass
class Way:
    name: str
    url: str  # the gateway in front of it
    streams: list[Stream] = field(default_factory=list)


def policy(kind: str, url: str, pacing: dict[str, Any] | None) -> dict[str, Any]:
    pool: dict[str, Any] = {"kind": kind, "endpoints": [{"url": url}], "max_in_flight": 256}
    if pacing is not None:
        pool["pacing"] = pacing
    return {"version": 1, "pools": {"pool": pool}, "rules": [{"name": "all", "route": "pool"}],
            "guard": {"enabled": False}}


def start(work: Path, args: argparse.Namespace) -> tuple[list[Way], list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    sims: dict[str, str] = {}
    for seed, kind in enumerate(("speculative", "standard"), args.seed):
        port = free_port()
        procs.append(spawn_module("specgate.cli", "sim", "--kind", kind, "--port", str(port), "--model", MODEL,
                                  "--time-scale", str(args.time_scale), "--seed", str(seed)))
        sims[kind] = f"http://127.0.0.1:{port}"
    pacing_on = {"enabled": True, "max_delay_ms": args.max_delay_ms}
    plans = [("speculative, pacing off", "speculative", None),
             ("speculative, pacing on", "speculative", pacing_on),
             ("standard (reference)", "standard", None)]
    ways = []
    for index, (name, kind, pacing) in enumerate(plans):
        path = work / f"policy-{index}.yaml"
        path.write_text(yaml.safe_dump(policy(kind, sims[kind], pacing)))
        port = free_port()
        procs.append(spawn_module("specgate.cli", "serve", "--policy", str(path), "--port", str(port),
                                  "--log-level", "warning", stderr=subprocess.DEVNULL))
        ways.append(Way(name, f"http://127.0.0.1:{port}"))
    for url, proc in [*((u, p) for u, p in zip(sims.values(), procs, strict=False)),
                      *((w.url, p) for w, p in zip(ways, procs[2:], strict=True))]:
        wait_until_ok(url + ("/readyz" if url in {w.url for w in ways} else "/health"), proc, timeout=60)
    return ways, procs


async def one(client: httpx.AsyncClient, way: Way, prompt: str, max_tokens: int) -> Stream:
    """One streamed answer; the running count in each chunk tells its tokens."""
    body = {"model": MODEL, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}],
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    started = time.perf_counter()
    events: list[tuple[float, int]] = []
    counted = 0
    async with client.stream("POST", way.url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            count = (chunk.get("usage") or {}).get("completion_tokens", counted)
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                events.append((time.perf_counter(), count - counted))
            counted = count
    return Stream(events[0][0] - started, time.perf_counter() - started, events)


async def load(ways: list[Way], args: argparse.Namespace) -> None:
    """Every way at once, `concurrency` streams each, until each has `requests`."""
    async def worker(client: httpx.AsyncClient, way: Way, start_at: int) -> None:
        for i in range(start_at, args.requests, args.concurrency):
            way.streams.append(await one(client, way, PROMPTS[i % len(PROMPTS)], args.max_tokens))

    limits = httpx.Limits(max_connections=4 * args.concurrency * len(ways))
    async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as client:
        await asyncio.gather(*(worker(client, way, i) for way in ways for i in range(args.concurrency)))


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values) if len(values) > 1 and any(values) else 0.0


def cadence(way: Way) -> dict[str, float]:
    tokens, events = [g for s in way.streams for g in s.token_gaps()], [g for s in way.streams for g in s.event_gaps()]
    return {"tokens/event": sum(t for s in way.streams for _, t in s.events) / sum(len(s.events) for s in way.streams),
            "token gap p50": quantile(tokens, 0.5) * 1e3, "p95": quantile(tokens, 0.95) * 1e3,
            "max": max(tokens) * 1e3, "CV": cv(tokens),
            "together %": 100 * sum(g < TOGETHER_S for g in tokens) / len(tokens),
            "event gap p50": quantile(events, 0.5) * 1e3, "p95 ": quantile(events, 0.95) * 1e3,
            "max ": max(events) * 1e3, "CV ": cv(events)}


def latency(way: Way) -> dict[str, float]:
    ttft, e2e = [s.ttft_s for s in way.streams], [s.e2e_s for s in way.streams]
    return {"TTFT p50": quantile(ttft, 0.5) * 1e3, "TTFT p95": quantile(ttft, 0.95) * 1e3,
            "E2E p50": quantile(e2e, 0.5) * 1e3, "E2E p95": quantile(e2e, 0.95) * 1e3}


def table(rows: dict[str, dict[str, float]]) -> list[str]:
    columns = list(next(iter(rows.values())))
    lines = ["| way | " + " | ".join(c.strip() for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    return lines + [f"| {name} | " + " | ".join(f"{v[c]:.2f}" for c in columns) + " |" for name, v in rows.items()]


def report(ways: list[Way], args: argparse.Namespace) -> str:
    timing = {way.name: latency(way) for way in ways}
    off, on = timing["speculative, pacing off"], timing["speculative, pacing on"]
    added = ", ".join(f"{c} {on[c] - off[c]:+.1f}" for c in off)
    return "\n".join([
        f"{args.requests} streams per way, {args.concurrency} at a time per way, max_tokens {args.max_tokens}, "
        f"max_delay_ms {args.max_delay_ms:g}, time scale {args.time_scale:g}; times in ms", "",
        *table({way.name: cadence(way) for way in ways}), "", *table(timing), "",
        f"added by pacing (on - off), ms: {added}"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="streams per way")
    parser.add_argument("--concurrency", type=int, default=4, help="streams at a time, per way")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-delay-ms", type=float, default=150.0)
    parser.add_argument("--time-scale", type=float, default=1.0, help="the simulators' --time-scale")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        ways, procs = start(Path(work), args)
        try:
            asyncio.run(load(ways, args))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=10)
    print(report(ways, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
