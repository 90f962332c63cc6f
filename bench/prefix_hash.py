"""What prefix affinity costs a request: hashing its prompt in blocks, and the
balancer's pick and record, per request, in microseconds.

Chat conversations of growing length (a shared system prompt, then turns of
user and assistant messages) are hashed at the default 256-character blocks
with a fresh `PromptKey` each time, as the gateway does once per request;
then a pool of 4 endpoints balancing by prefix picks and records an endpoint
for each (an acquire and release of its lease), with the prefix map warm;
`least_outstanding_us` is the same acquire and release in a pool that
balances by two random choices, for comparison. Prints one JSON line per
prompt size.

    python bench/prefix_hash.py --repeat 2000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.policy.pools import PoolSpec  # noqa: E402 - importable once the root is on sys.path
from gateway.upstream.pools import Pool  # noqa: E402 - importable once the root is on sys.path
from gateway.upstream.prompt_key import PromptKey  # noqa: E402 - importable once the root is on sys.path

SYSTEM = "You are a helpful assistant who answers in short, precise sentences. " * 30  # ~2 k characters


def conversation(turns: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn} " + "word " * rng.randint(20, 80)})
        messages.append({"role": "assistant", "content": "answer " * rng.randint(50, 200)})
    messages.append({"role": "user", "content": "and then?"})
    return {"model": "m", "messages": messages}


def per_request_us(bodies: list[dict[str, Any]], repeat: int, pool: Pool | None) -> float:
    started = time.perf_counter()
    for i in range(repeat):
        key = PromptKey(bodies[i % len(bodies)], "chat", {})
        if pool is None:
            key.blocks(256)
        else:
            pool.acquire(key=key).release(True)
    return (time.perf_counter() - started) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    endpoints = [{"url": f"http://10.0.0.{i}:8000"} for i in range(4)]
    for turns in (0, 2, 8, 32):
        bodies = [conversation(turns, seed) for seed in range(64)]
        chars = sum(len(m["content"]) for m in bodies[0]["messages"])
        pool = Pool("p", PoolSpec(kind="standard", endpoints=endpoints), rng=random.Random(1))
        plain = Pool("p", PoolSpec(kind="standard", endpoints=endpoints, balance="least_outstanding"),
                     rng=random.Random(1))
        per_request_us(bodies, len(bodies), pool)  # warm the map: every prompt seen once
        print(json.dumps({"turns": turns, "prompt_chars": chars,
                          "blocks": len(PromptKey(bodies[0], "chat", {}).blocks(256).hashes),
                          "hash_us": round(per_request_us(bodies, args.repeat, None), 2),
                          "hash_pick_record_us": round(per_request_us(bodies, args.repeat, pool), 2),
                          "least_outstanding_us": round(per_request_us(bodies, args.repeat, plain), 2)}))


if __name__ == "__main__":
    main()
