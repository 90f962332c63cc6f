"""Innocent clients' latency while other clients send 8 MB prompts, with prompt
capture off and on (share 1.0: every prompt offered to the capture stage).

One gateway process per configuration (`specgate serve`) in front of the fast
fake backend (bench/fast_upstream.py), all on 127.0.0.1. In each, a few
innocent clients send small chat requests one after another while big clients,
in a process of their own (their event loop is not the innocent clients'),
send a bounded number of 8 MB prompts; the innocent requests' p50 and p99 are
reported, with the CPU time the gateway used meanwhile (`gateway_cpu_s`) and
its child processes (`children_cpu_s`: the scrubbing process, where it has one),
and, at the end, their resident memory (`gateway_rss_mb`, `children_rss_mb`). `quiet` runs the
innocent clients alone, as the baseline; `direct` sends the same load to the
backend with no gateway between (what the load generator and the backend
cost by themselves). With capture on, the gateway builds its scrubber
(presidio's imports) before its port opens: `started_s` is the time from the
process's start to its port listening, and the measurement starts once a
warm-up prompt is written (`first_written_s`, from the port opening; a
gateway from before that change built the scrubber on that prompt).
`--baseline REF` also runs the gateway as of git commit REF in the same run.
`--big-chars N` sends big prompts of N characters instead: under
capture's `max_prompt_bytes` (256 KiB) they are scrubbed, not skipped.
`--cold` measures from the moment the port opens (no warm-up, no wait for
a written prompt): whatever the gateway still builds while it serves falls
in the measurement.

    python bench/capture_p99.py --innocent 400 --big 24 [--baseline REF] [--cold]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import export_tree  # noqa: E402 (the sibling modules)
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


async def big(url: str, count: int, clients: int, chars: int = BIG_CHARS,
              ready: Callable[[], None] = lambda: None) -> None:
    body = json.dumps({**SMALL, "messages": [{"role": "user", "content": "secret=abc " * (chars // 11)}]})
    async with httpx.AsyncClient(timeout=120) as client:
        ready()
        async def one_client(n: int) -> None:
            for _ in range(n):
                await client.post(url, content=body, headers={"content-type": "application/json"})
        await asyncio.gather(*(one_client(count // clients) for _ in range(clients)))


def big_process(url: str, count: int, clients: int, chars: int, ready: EventType) -> None:
    asyncio.run(big(url, count, clients, chars, ready.set))


def measure(url: str, args: argparse.Namespace, with_big: bool) -> list[float]:
    """The innocent clients' latencies, with the big clients sending from another process meanwhile."""
    sender = None
    if with_big:
        context = multiprocessing.get_context("spawn")
        ready = context.Event()
        sender = context.Process(target=big_process, args=(url, args.big, args.big_clients, args.big_chars, ready))
        sender.start()
        ready.wait(60)  # the innocent clients start when the big ones are about to send
    try:
        return asyncio.run(innocent(url, args.innocent, args.clients))
    finally:
        if sender is not None:
            sender.join(300)
            sender.kill()


def summary(name: str, latencies: list[float]) -> dict:
    latencies = sorted(latencies)
    return {"config": name, "requests": len(latencies),
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1)}


def run(name: str, capture: bool, with_big: bool, upstream: int, tmp: Path, args: argparse.Namespace,
        tree: Path = ROOT) -> dict:
    policy = bench_policy(upstream)
    if capture:
        policy += f"\ncapture:\n  enabled: true\n  share: 1.0\n  directory: {tmp / name}\n"
    path = tmp / f"{name}.yaml"
    path.write_text(policy)
    port = free_port()
    started = time.perf_counter()
    proc = start([sys.executable, "-m", "specgate.cli", "serve", "--policy", str(path), "--host", "127.0.0.1",
                  "--port", str(port)], tmp / f"{name}.log", {**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
    try:
        wait_port(port, timeout=300)  # with capture on, the scrubber is built first
        started_s = round(time.perf_counter() - started, 1)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        listening = time.perf_counter()
        written_s = None
        if not args.cold:
            asyncio.run(innocent(url, 40, 4))  # warm up
            written_s = first_written(port, listening) if capture else None
        cpu_before, children_before = cpu_seconds(proc.pid), children_cpu_seconds(proc.pid)
        latencies = measure(url, args, with_big)
        cpu_s = round(cpu_seconds(proc.pid) - cpu_before, 2)
        children_s = round(children_cpu_seconds(proc.pid) - children_before, 2)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        memory = {"gateway_rss_mb": rss_mb(proc.pid),
                  "children_rss_mb": round(sum(rss_mb(child) for child in children(proc.pid)), 1)}
    finally:
        proc.terminate()
        proc.wait(30)
    dropped = {line.split('"')[1]: float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("specgate_capture_dropped_total{")}
    return summary(name, latencies) | {"gateway_cpu_s": cpu_s, "children_cpu_s": children_s,
                                       **memory, "capture_dropped": dropped,
                                       "started_s": started_s, "first_written_s": written_s}


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process `pid` has used, from /proc (Linux):
    what the gateway worked, which a shared host's other load does not inflate as it does latency."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (a gateway that scrubs in a process of its own: that one)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it exited meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def children_cpu_seconds(pid: int) -> float:
    return sum(cpu_seconds(child) for child in children(pid))


def rss_mb(pid: int) -> float:
    """The resident memory of process `pid`, in MiB (VmRSS, from /proc)."""
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))
    return round(int(line.split()[1]) / 1024, 1)


def first_written(port: int, since: float, limit_s: float = 300.0) -> float:
    """Seconds from `since` until the gateway has written a captured prompt: capture works,
    and the scrubber is built (before the port opened, or on that prompt before that change)."""
    while time.perf_counter() - since < limit_s:
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        if any(line.startswith("specgate_capture_written_total ") and float(line.split()[-1]) > 0
               for line in metrics.splitlines()):
            return round(time.perf_counter() - since, 1)
        time.sleep(0.5)
    raise RuntimeError(f"no captured prompt written within {limit_s:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--innocent", type=int, default=400, help="innocent requests in all")
    parser.add_argument("--clients", type=int, default=4, help="innocent clients")
    parser.add_argument("--big", type=int, default=24, help="8 MB prompts in all")
    parser.add_argument("--big-chars", type=int, default=BIG_CHARS,
                        help="characters in each big prompt; under capture's max_prompt_bytes (256 KiB by default) "
                             "capture scrubs them")
    parser.add_argument("--big-clients", type=int, default=4)
    parser.add_argument("--baseline", metavar="REF", help="also run the gateway as of this git commit")
    parser.add_argument("--cold", action="store_true", help="measure from the moment the gateway's port opens: "
                        "no warm-up, and no wait for a first captured prompt")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        upstream = free_port()
        backend = start([sys.executable, str(ROOT / "bench" / "fast_upstream.py"), "--port", str(upstream)],
                        tmp / "upstream.log")
        try:
            wait_port(upstream)
            direct = f"http://127.0.0.1:{upstream}/v1/chat/completions"
            asyncio.run(innocent(direct, 40, 4))  # warm up
            for name, with_big in (("direct, quiet", False), ("direct, big prompts", True)):
                print(json.dumps(summary(name, measure(direct, args, with_big))), flush=True)
            configs = [("quiet", False, False, ROOT), ("big, capture off", False, True, ROOT),
                       ("big, capture on", True, True, ROOT)]
            if args.baseline:
                tree = export_tree(args.baseline, tmp / "baseline")
                configs[1:1] = [(f"{args.baseline}: big, capture off", False, True, tree),
                                (f"{args.baseline}: big, capture on", True, True, tree)]
            for name, capture, with_big, tree in configs:
                slug = "".join(c if c.isalnum() else "-" for c in name)
                print(json.dumps(run(slug, capture, with_big, upstream, tmp, args, tree) | {"config": name}),
                      flush=True)
        finally:
            backend.terminate()
            backend.wait(30)


if __name__ == "__main__":
    main()
