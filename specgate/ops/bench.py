"""Benchmark OpenAI-compatible endpoints (`specgate bench`): TTFT, TPOT, E2E, throughput per concurrency.

Several targets (backends, or the gateway) are measured in one run and
interleaved: every round sends the same batch of requests to each target in
turn, rotating which goes first, so a noisy machine hurts all alike. Writes
OUT/results.json and PNG plots (TPOT and throughput against concurrency, one
line per target). When a target is the gateway, results count which pool
served each request (x-specgate-pool).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specgate.ops.measure import Sample, summarize, timed_request
from specgate.ops.prompts import Prompt


async def run_bench(urls: Sequence[str], levels: Sequence[int], requests: int, prompts: Sequence[Prompt], *,
                    model: str, max_tokens: int, timeout_s: float = 600.0,
                    on_done: Callable[[Sample], None] = lambda sample: None) -> dict[str, Any]:
    import httpx

    samples: list[Sample] = []
    walls: dict[tuple[str, int], float] = {}
    cycle = itertools.cycle(prompts)
    limits = httpx.Limits(max_connections=max(levels) * 2)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, trust_env=False) as client:
        for level in levels:
            rounds = max(1, -(-requests // level))
            for number in range(rounds):
                batch = [next(cycle) for _ in range(min(level, requests - number * level) or level)]
                order = list(urls[number % len(urls):]) + list(urls[:number % len(urls)])
                for url in order:
                    started = time.perf_counter()
                    done = await asyncio.gather(*(
                        timed_request(client, url, prompt, model=model, max_tokens=max_tokens, target=url,
                                      concurrency=level) for prompt in batch))
                    walls[url, level] = walls.get((url, level), 0.0) + time.perf_counter() - started
                    for sample in done:
                        on_done(sample)
                    samples.extend(done)
    results = [{"target": url, "concurrency": level,
                **summarize([s for s in samples if (s.target, s.concurrency) == (url, level)], walls[url, level])}
               for level in levels for url in urls]
    return {"model": model, "max_tokens": max_tokens, "requests_per_level": requests, "levels": list(levels),
            "targets": list(urls), "results": results, "samples": [s.to_json() for s in samples]}


def served_model(url: str) -> str:
    """The first model id a server lists at /v1/models."""
    import httpx

    response = httpx.get(url.rstrip("/") + "/v1/models", timeout=30, trust_env=False)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def plot(report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    charts = (("tpot", "TPOT p50 (ms)", "tpot.png"), ("throughput", "output tokens/s", "throughput.png"))
    for key, label, file in charts:
        figure, axis = plt.subplots(figsize=(6, 4))
        for url in report["targets"]:
            rows = [r for r in report["results"] if r["target"] == url]
            xs = [r["concurrency"] for r in rows]
            ys = [(r["tpot_s"]["p50"] or 0) * 1000 if key == "tpot" else r["output_tokens_per_s"] for r in rows]
            axis.plot(xs, ys, marker="o", label=url)
        axis.set_xlabel("concurrency")
        axis.set_ylabel(label)
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
        figure.tight_layout()
        figure.savefig(out / file, dpi=110)
        plt.close(figure)
        written.append(out / file)
    return written
