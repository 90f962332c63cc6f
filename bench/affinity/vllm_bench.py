"""Prefix affinity on real vLLM: two CPU replicas of SmolLM2 in one pool behind the gateway.

Both replicas are started once, as `specgate up` starts vLLM (the `standard`
profile, float32, `--max-model-len 2048`, automatic prefix caching on, V1's
default) and kept for every run. Before each run both prefix caches are
emptied (`POST /reset_prefix_cache`, vLLM's dev mode) and a gateway is started
with the arm's `balance:`. The arms alternate run by run (A B, B A, ...), each
pair on the same trace: a few dozen conversations of 3-4 turns, a few at once.

    python bench/affinity/vllm_bench.py --rounds 2 --concurrency 4

To keep the replicas up across several benchmark runs, start them alone and
pass their URLs (they must run with VLLM_SERVER_DEV_MODE=1, as these do):

    python bench/affinity/vllm_bench.py --serve-only      # prints the URLs; Ctrl-C stops them
    python bench/affinity/vllm_bench.py --backends URL,URL

Writes bench/out/affinity/vllm.json and vllm-ttft-by-turn.png. The machine's
load average before and after each run is in the results.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402 - after the root is on sys.path, as below

from backends.model import prepare  # noqa: E402 - importable once the root is on sys.path
from bench.affinity import rounds, stack, trace  # noqa: E402 - as above
from bench.affinity.drive import Player, play  # noqa: E402 - as above
from specgate.up import SERVED_MODEL, stop_all  # noqa: E402 - as above

OUT = ROOT / "bench" / "out" / "affinity"
START_TIMEOUT_S = 900.0  # 2-4 minutes a server when the CPU is free; two load at once


def reset_caches(urls: list[str]) -> None:
    """Empty every replica's prefix cache (retried: vLLM refuses while blocks are held)."""
    for url in urls:
        for _ in range(50):
            response = httpx.post(url + "/reset_prefix_cache", timeout=30, trust_env=False)
            if response.status_code == 404:
                raise SystemExit(f"{url} has no /reset_prefix_cache: start vLLM with VLLM_SERVER_DEV_MODE=1")
            if response.status_code == 200 and response.json().get("success", True) is not False:
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"{url} would not empty its prefix cache")


def warm_up(urls: list[str]) -> None:
    """One short request to each replica, so the first measured turn pays no warm-up."""
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "Hello."}], "max_tokens": 4}
    for url in urls:
        httpx.post(url + "/v1/chat/completions", json=body, timeout=600, trust_env=False).raise_for_status()


def run_arm(args: argparse.Namespace, arm: str, urls: list[str], conversations: list[trace.Conversation],
            label: str, work: Path) -> rounds.Run:  # fmt: skip
    reset_caches(urls)
    gateway = stack.start_gateway(urls, arm, args.affinity, work)
    try:
        player = Player(stack.url_of(gateway), SERVED_MODEL, args.max_tokens, {}, args.session_header)
        return asyncio.run(play(player, conversations, urls, label, args.concurrency))
    finally:
        stop_all([gateway], stack.say)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs, the arms' order alternating")
    parser.add_argument("--arms", default="least_outstanding,prefix", help="balance values, comma-separated")
    parser.add_argument("--conversations", type=int, default=trace.VLLM_SHAPE.conversations)
    parser.add_argument("--concurrency", type=int, default=4, help="conversations played at once")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--affinity", type=json.loads, default=None, help="the prefix arm's `affinity:` as JSON")
    parser.add_argument("--session-header", help="send each conversation's id in this header")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--serve-only", action="store_true", help="start the two replicas and keep them up")
    parser.add_argument("--backends", help="comma-separated URLs of replicas already running; none started")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="specgate-affinity-vllm-"))
    print(f"logs and policies: {work}", flush=True)
    shape = dataclasses.replace(trace.VLLM_SHAPE, conversations=args.conversations)
    replicas = [] if args.backends else stack.vllm_replicas(2, prepare(), work)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the replicas on the way out
    try:
        stack.start(replicas, START_TIMEOUT_S)
        urls = args.backends.split(",") if args.backends else [stack.url_of(r) for r in replicas]
        warm_up(urls)
        if args.serve_only:
            print("replicas up: --backends " + ",".join(urls), flush=True)
            signal.pause()
        runs, results = rounds.interleaved(args.arms.split(","), args.rounds, shape, args.seed,
                                           lambda arm, convs, label: run_arm(args, arm, urls, convs, label, work))
    finally:
        stop_all(replicas, stack.say)
    setup = {"rounds": args.rounds, "seed": args.seed, "shape": shape.__dict__, "max_tokens": args.max_tokens,
             "concurrency": args.concurrency, "affinity": args.affinity}  # fmt: skip
    rounds.write(args.out, "vllm", setup, runs, results, "2 vLLM CPU replicas of SmolLM2")


if __name__ == "__main__":
    main()
