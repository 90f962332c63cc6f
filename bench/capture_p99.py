"""Innocent clients' latency while other clients send 8 MB prompts, with prompt
capture off and on (share 1.0: every prompt offered to the capture stage).

One gateway process per configuration (`specgate serve`) in front of the fast
fake backend (bench/fast_upstream.py), all on 127.0.0.1. In each, a few
innocent clients send small chat requests one after another while big clients
send a bounded number of 8 MB prompts; the innocent requests' p50 and p99 are
reported. `quiet` runs the innocent clients alone, as the baseline.

    python bench/capture_p99.py --innocent 400 --big 24
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import ROOT, bench_policy, free_port, start, wait_port  # noqa: E402 (the sibling module)

SMALL = {"model": "bench", "messages": [{"role": "user", "content": "Write a haiku about rivers."}],
         "temperature": 0, "max_tokens": 64}
BIG_CHARS = 8_000_000  # under the default 8 MiB body limit, JSON included


async def innocent(url: str, count: int, clients: int) -> list[float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=120) as client:
        async def one_client(n: int) -> None:
            for _ in range(n):
                started = time.perf_counter()
                response = await client.post(url, json=SMALL)
                response.raise_for_status()
                latencies.append(time.perf_counter() - started)
        await asyncio.gather(*(one_client(count // clients) for _ in range(clients)))
    return latencies


async def big(url: str, count: int, clients: int) -> None:
    body = json.dumps({**SMALL, "messages": [{"role": "user", "content": "secret=abc " * (BIG_CHARS // 11)}]})
    async with httpx.AsyncClient(timeout=120) as client:
        async def one_client(n: int) -> None:
            for _ in range(n):
                await client.post(url, content=body, headers={"content-type": "application/json"})
        await asyncio.gather(*(one_client(count // clients) for _ in range(clients)))


async def measure(url: str, args: argparse.Namespace, with_big: bool) -> list[float]:
    tasks = [innocent(url, args.innocent, args.clients)]
    if with_big:
        tasks.append(big(url, args.big, args.big_clients))  # type: ignore[arg-type] - gather mixes the two result types
    results = await asyncio.gather(*tasks)
    return results[0]


def run(name: str, capture: bool, with_big: bool, upstream: int, tmp: Path, args: argparse.Namespace) -> dict:
    policy = bench_policy(upstream)
    if capture:
        policy += f"\ncapture:\n  enabled: true\n  share: 1.0\n  directory: {tmp / name}\n"
    path = tmp / f"{name}.yaml"
    path.write_text(policy)
    port = free_port()
    proc = start([sys.executable, "-m", "specgate.cli", "serve", "--policy", str(path), "--host", "127.0.0.1",
                  "--port", str(port)], tmp / f"{name}.log", cwd=ROOT)
    try:
        wait_port(port, timeout=60)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        asyncio.run(innocent(url, 40, 4))  # warm up
        latencies = sorted(asyncio.run(measure(url, args, with_big)))
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        proc.terminate()
        proc.wait(30)
    dropped = {line.split('"')[1]: float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("specgate_capture_dropped_total{")}
    return {"config": name, "requests": len(latencies),
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
            "capture_dropped": dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--innocent", type=int, default=400, help="innocent requests in all")
    parser.add_argument("--clients", type=int, default=4, help="innocent clients")
    parser.add_argument("--big", type=int, default=24, help="8 MB prompts in all")
    parser.add_argument("--big-clients", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        upstream = free_port()
        backend = start([sys.executable, str(ROOT / "bench" / "fast_upstream.py"), "--port", str(upstream)],
                        tmp / "upstream.log")
        try:
            wait_port(upstream)
            for name, capture, with_big in (("quiet", False, False), ("big, capture off", False, True),
                                            ("big, capture on", True, True)):
                print(json.dumps(run(name.replace(", ", "-").replace(" ", "-"), capture, with_big, upstream,
                                     tmp, args) | {"config": name}), flush=True)
        finally:
            backend.terminate()
            backend.wait(30)


if __name__ == "__main__":
    main()
