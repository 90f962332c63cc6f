"""Drafting on real vLLM CPU: plain, n-gram and the shipped EAGLE-3 head.

    python -m bench.draft_vllm [--prompts data/draft/heldout.jsonl] [--per-class N] [--max-tokens 64]
        [--server PROFILE=URL ...] [--out draft_vllm.json]

One vLLM server per launch profile (`standard`, `speculative-ngram`,
`speculative-eagle3-local`), started one after the other by `specgate up`'s
code (float32, `--max-model-len 2048`) and kept running; then every prompt is
sent to each server in turn (interleaved), one request at a time, greedy and
at `--temperature`. The speculative counters of vLLM's /metrics are read
before and after each request, so the deltas belong to that request:
acceptance per position, mean accepted length (1 + accepted / drafts) and
tokens/s (completion tokens over the request's wall time) per prompt class.
Greedy texts are compared with the standard server's. `--server` uses a
server already running for a profile instead of starting one. The JSON is
rewritten after every prompt, so a stopped run keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from backends.model import prepare
from gateway.policy.kinds import PoolKind
from specgate import replicas
from specgate.replicas import vllm_backend
from specgate.up import Service, stop_all, wait_healthy
from tests.fakes.process import free_port

PROFILES = ("standard", "speculative-ngram", "speculative-eagle3-local")
COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
START_TIMEOUT_S = 900.0


def spec_counters(client: httpx.Client, url: str) -> dict[str, float]:
    """The speculative counters of one server, per position as `...{position}`."""
    found: dict[str, float] = defaultdict(float)
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        base = name.split("{", 1)[0]
        if base in COUNTERS:
            found[base] += float(value)
        elif base == PER_POSITION:
            position = name.split('position="', 1)[1].split('"', 1)[0]
            found[f"pos{position}"] += float(value)
    return dict(found)


def start(profile: str, model_dir: Path, logs: Path) -> tuple[Service, str]:
    port = free_port()
    kind = PoolKind.STANDARD if profile == "standard" else PoolKind.SPECULATIVE
    replica = replicas.Replica(profile, kind, port)
    service = vllm_backend(replica, model_dir, logs / profile, speculative_profile=profile)
    service.start()
    wait_healthy([service], START_TIMEOUT_S, print)
    return service, f"http://127.0.0.1:{port}"


def ask(client: httpx.Client, url: str, messages: list[dict[str, Any]], temperature: float,
        max_tokens: int) -> dict[str, Any]:
    before = spec_counters(client, url)
    started = time.perf_counter()
    reply = client.post(f"{url}/v1/chat/completions", json={
        "model": "smollm2", "messages": messages, "temperature": temperature, "max_tokens": max_tokens,
        "seed": 1}).raise_for_status().json()
    elapsed = time.perf_counter() - started
    after = spec_counters(client, url)
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    return {"text": reply["choices"][0]["message"]["content"], "tokens": reply["usage"]["completion_tokens"],
            "seconds": elapsed, "spec": delta}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    spec: dict[str, float] = defaultdict(float)
    for row in rows:
        for key, value in row["spec"].items():
            spec[key] += value
    drafts = spec.get(COUNTERS[0], 0.0)
    out: dict[str, Any] = {"requests": len(rows), "tokens": tokens, "seconds": round(seconds, 2),
                           "tokens_per_s": round(tokens / seconds, 2) if seconds else None}
    if drafts:
        positions = sorted((k for k in spec if k.startswith("pos")), key=lambda k: int(k[3:]))
        out.update(drafts=int(drafts), draft_tokens=int(spec[COUNTERS[1]]), accepted=int(spec[COUNTERS[2]]),
                   acceptance=round(spec[COUNTERS[2]] / spec[COUNTERS[1]], 3),
                   acceptance_per_position=[round(spec[k] / drafts, 3) for k in positions],
                   mean_accepted_length=round(1 + spec[COUNTERS[2]] / drafts, 3))
    return out


def load_prompts(path: str, per_class: int | None) -> list[dict[str, Any]]:
    """The prompts, or the first `per_class` of each class, in file order."""
    prompts = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not per_class:
        return prompts
    seen: dict[str, int] = defaultdict(int)
    kept = []
    for prompt in prompts:
        seen[prompt.get("class", "")] += 1
        if seen[prompt.get("class", "")] <= per_class:
            kept.append(prompt)
    return kept


def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = load_prompts(args.prompts, args.per_class)
    model_dir, logs = prepare(), Path(args.logs)
    urls = dict(item.split("=", 1) for item in args.server)
    started: list[Service] = []
    results: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    try:
        for profile in args.profiles:
            if profile not in urls:
                service, urls[profile] = start(profile, model_dir, logs)
                started.append(service)
        with httpx.Client(timeout=600) as client:
            for temperature in args.temperatures:
                for n, prompt in enumerate(prompts):
                    kind = prompt.get("class", "all").split("/")[0]
                    for profile in args.profiles:
                        row = ask(client, urls[profile], prompt["messages"], temperature, args.max_tokens)
                        row.update(prompt=n, kind=kind)
                        results[f"t{temperature:g}"][profile].append(row)
                    Path(args.out).write_text(json.dumps(report(results), indent=1))
                    print(f"t={temperature:g} prompt {n + 1}/{len(prompts)}", flush=True)
    finally:
        stop_all(started, progress=print)
    return report(results)


def report(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for temp, by_profile in results.items():
        for profile, rows in by_profile.items():
            kinds = sorted({r["kind"] for r in rows})
            summary.setdefault(temp, {})[profile] = {
                "all": summarise(rows), **{k: summarise([r for r in rows if r["kind"] == k]) for k in kinds}}
        if temp == "t0" and "standard" in by_profile:
            plain = {r["prompt"]: r["text"] for r in by_profile["standard"]}
            for profile, rows in by_profile.items():
                summary[temp][profile]["greedy_text_differs"] = [r["prompt"] for r in rows
                                                                 if r["text"] != plain[r["prompt"]]]
    return {"summary": summary, "rows": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="data/draft/heldout.jsonl")
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES))
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--per-class", type=int, help="only the first N prompts of each class")
    parser.add_argument("--server", action="append", default=[], metavar="PROFILE=URL",
                        help="a running server for PROFILE (not started nor stopped here)")
    parser.add_argument("--logs", default="draft_vllm_logs")
    parser.add_argument("--out", default="draft_vllm.json")
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
