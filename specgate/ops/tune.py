"""Find the draft length that pays off on this hardware (`specgate tune`).

Starts the standard profile once and keeps it up; then, for every candidate
`num_speculative_tokens` (and, for n-gram, `prompt_lookup_max`), starts the
speculative profile with it, warms it up, and benchmarks it INTERLEAVED with
the standard server (same prompts, same rounds, alternating order), so each
speedup compares two servers measured under the same noise. Acceptance per
candidate comes from the server's own spec-decode counters (/metrics,
delta across the run). Recommends the candidate with the best E2E p50 speedup.

A launcher is `launch(spec_config, port)`, a context manager that yields the
server's base URL once it is ready and stops it afterwards; `spec_config` is
None for the standard profile. The real one starts vLLM from the launch
profiles (backends/vllm); tests pass one that starts the pool simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from specgate.ops.bench import run_bench, served_model
from specgate.ops.measure import timed_request
from specgate.ops.prompts import Prompt
from specgate.replicas import VLLM_CPU_ARGS
from specgate.up import SERVED_MODEL, Service, wait_healthy

Launch = Callable[[Mapping[str, Any] | None, int], AbstractContextManager[str]]
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"


def candidates(values: Sequence[int], lookup_max: Sequence[int] = ()) -> list[dict[str, int]]:
    """Speculative config overrides to try, every combination of the two lists."""
    if not lookup_max:
        return [{"num_speculative_tokens": k} for k in values]
    return [{"num_speculative_tokens": k, "prompt_lookup_max": m} for k, m in itertools.product(values, lookup_max)]


def spec_counters(url: str) -> tuple[float, float]:
    """(accepted, drafted) token counters summed over a server's /metrics."""
    import httpx

    from gateway.control.signals.scrape import parse_exposition

    text = httpx.get(url.rstrip("/") + "/metrics", timeout=30, trust_env=False).text
    values = parse_exposition(text, {ACCEPTED, DRAFTED})
    return (sum(v for (name, _), v in values.items() if name == ACCEPTED),
            sum(v for (name, _), v in values.items() if name == DRAFTED))


def _warm_up(url: str, prompt: Prompt, model: str) -> None:
    import httpx


    async def once() -> None:
        async with httpx.AsyncClient(timeout=600, trust_env=False) as client:
            await timed_request(client, url, prompt, model=model, max_tokens=16, target=url, concurrency=1)

    asyncio.run(once())


def sweep(launch: Launch, configs: Sequence[Mapping[str, Any]], prompts: Sequence[Prompt], *, requests: int,
          concurrency: int, max_tokens: int, port: int, model: str | None = None,
          progress: Callable[[str], None] = print) -> dict[str, Any]:

    rows = []
    with launch(None, port) as standard:
        model = model or served_model(standard)
        _warm_up(standard, prompts[0], model)
        for config in configs:
            progress(f"candidate {json.dumps(dict(config), sort_keys=True)}: starting")
            with launch(config, port + 1) as url:
                _warm_up(url, prompts[0], model)
                accepted_before, drafted_before = spec_counters(url)
                bench = asyncio.run(run_bench([url, standard], [concurrency], requests, prompts, model=model,
                                              max_tokens=max_tokens))
                accepted, drafted = spec_counters(url)
            row = _row(config, bench, url, standard, accepted - accepted_before, drafted - drafted_before)
            progress(f"  speedup {_fmt(row['speedup'], '{:.2f}x')}, acceptance {_fmt(row['acceptance'])}")
            rows.append(row)
    measured = [r for r in rows if r["speedup"] is not None]
    best = max(measured, key=lambda r: r["speedup"]) if measured else None
    return {"model": model, "requests": requests, "concurrency": concurrency, "max_tokens": max_tokens,
            "candidates": rows, "recommended": best["config"] if best else None}


def _row(config: Mapping[str, Any], bench: Mapping[str, Any], url: str, standard: str, accepted: float,
         drafted: float) -> dict[str, Any]:
    by_target = {r["target"]: r for r in bench["results"]}
    spec, std = by_target[url], by_target[standard]
    spec_e2e, std_e2e = spec["e2e_s"]["p50"], std["e2e_s"]["p50"]
    return {"config": dict(config), "e2e_p50_s": spec_e2e, "standard_e2e_p50_s": std_e2e,
            "tpot_p50_s": spec["tpot_s"]["p50"], "standard_tpot_p50_s": std["tpot_s"]["p50"],
            "speedup": std_e2e / spec_e2e if spec_e2e and std_e2e else None,
            "acceptance": accepted / drafted if drafted else None, "draft_tokens": drafted,
            "errors": spec["errors"] + std["errors"]}


def _fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "n/a" if value is None else pattern.format(value)


def table(result: Mapping[str, Any]) -> str:
    lines = ["| config | E2E p50 s | standard E2E p50 s | speedup | TPOT p50 ms | acceptance | errors |",
             "|---|---|---|---|---|---|---|"]
    for row in result["candidates"]:
        config = ", ".join(f"{k}={v}" for k, v in row["config"].items())
        tpot = None if row["tpot_p50_s"] is None else row["tpot_p50_s"] * 1000
        lines.append(f"| {config} | {_fmt(row['e2e_p50_s'])} | {_fmt(row['standard_e2e_p50_s'])} | "
                     f"{_fmt(row['speedup'], '{:.2f}x')} | {_fmt(tpot, '{:.1f}')} | {_fmt(row['acceptance'])} | "
                     f"{row['errors']} |")
    return "\n".join(lines)


def vllm_launcher(profile_name: str, cache: str | None = None) -> Launch:
    """Start vLLM's CPU server from a launch profile, serving the packaged model."""
    from backends.model import cache_dir, prepare
    from backends.vllm import load_profiles, render

    _, profiles = load_profiles()
    model_dir = prepare(cache)
    logs = cache_dir(cache) / "logs"

    @contextlib.contextmanager
    def launch(spec_config: Mapping[str, Any] | None, port: int) -> Iterator[str]:
        profile = profiles["standard" if spec_config is None else profile_name]
        argv = render(profile, model=str(model_dir), port=port, served_model_name=SERVED_MODEL,
                      spec_config=spec_config, extra_args=VLLM_CPU_ARGS)
        service = Service(f"vLLM {profile.name} (:{port})", argv, f"http://127.0.0.1:{port}/health",
                          logs / f"tune-{port}.log", {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
        service.start()
        try:
            wait_healthy([service], 900.0, print)
            yield f"http://127.0.0.1:{port}"
        finally:
            service.stop()

    return launch
