"""Where a served request's time goes: `specgate serve` profiled under load.

Serves the gateway as bench/overhead.py does (the bench policy, both pools on
bench/fast_upstream.py, one worker, compiled unless `--sources`), loads it with
the same aiohttp client for `--duration` seconds after a warm-up, and prints:

- the interpreted Python calls a request (cProfile, switched on in the server
  only while the measured load runs: its start-up is not counted). Compiled
  functions are not seen by cProfile, so what it lists is what is left in
  Python: the server's, the framework's, the standard library's and the
  gateway's own interpreted modules;
- with `--perf`, in a second load, the share of the server's CPU samples in
  each shared object (`perf record`; the interpreter's own frames are
  `_PyEval_EvalFrameDefault`), the kernel's included; `--symbols N` adds the N functions
  with the most samples;
- with `--callgrind N`, in a third load, the server's instructions a request
  (valgrind's callgrind, counting only while the measured load runs) and the N
  compiled functions with the most, callees included. A count does not move with
  what else runs on the host, so a change of a few thousand instructions shows.

    python bench/served_profile.py [--mode stream] [--concurrency 32] [--duration 5]
        [--perf [--symbols N]] [--callgrind N] [--prompt-chars N] [--sources]

It is a profile, not a timing: cProfile slows every interpreted call, so its
requests a second are not the gateway's (bench/overhead.py measures those).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from overhead import PROMPT, bench_policy, body, free_port, run_aiohttp, start, wait_port  # noqa: E402 (the sibling module)

BEGIN, END = signal.SIGUSR1, signal.SIGUSR2  # the server's profiler: on, then off and written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("json", "stream"), default="stream",
                        help="non-streamed or streamed (16 events; the default)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of measured load (default 5)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before it (default 2)")
    parser.add_argument("--top", type=int, default=25, help="rows of the interpreted calls (default 25)")
    parser.add_argument("--perf", action="store_true", help="also sample the server with perf, by shared object")
    parser.add_argument("--symbols", type=int, default=0, metavar="N",
                        help="with --perf, also the N functions with the most samples (default none)")
    parser.add_argument("--callgrind", type=int, default=0, metavar="N",
                        help="also count the server's instructions a request under valgrind's callgrind, and "
                             "list the N compiled functions with the most, callees included (default none)")
    parser.add_argument("--prompt-chars", type=int, default=len(PROMPT), metavar="N",
                        help=f"the prompt's length in characters (default {len(PROMPT)}, as bench/overhead.py's)")
    parser.add_argument("--sources", action="store_true", help="serve the sources, not the compiled build")
    parser.add_argument("--profiled-serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)  # the server's side
    args = parser.parse_args()
    if args.prompt_chars < 1:
        parser.error("--prompt-chars must be at least 1")
    if args.profiled_serve is not None:
        profiled_serve(args.profiled_serve)
        return
    with tempfile.TemporaryDirectory(prefix="specgate-served-profile-") as work:
        tmp = Path(work)
        calls, requests = profile_calls(args, tmp)
        print(f"interpreted calls a request, {requests} requests ({args.mode}, {args.concurrency} connections):")
        print(calls_table(calls, requests, args.top))
        if args.perf:
            print(perf_table(args, tmp))
        if args.callgrind:
            print(callgrind_table(args, tmp))


def profiled_serve(argv: list[str]) -> None:
    """`specgate serve` with cProfile switched on by BEGIN and off by END, which writes it."""
    profile, out = cProfile.Profile(), os.environ["SPECGATE_PROFILE_OUT"]

    def end(*_: object) -> None:
        profile.disable()
        profile.dump_stats(out)

    signal.signal(BEGIN, lambda *_: profile.enable())
    signal.signal(END, end)
    sys.argv = ["specgate", *argv]
    runpy.run_module("specgate.cli", run_name="__main__")


def serving(args: argparse.Namespace, tmp: Path, profiled: bool,
            under: list[str] | None = None) -> tuple[subprocess.Popen, str, subprocess.Popen]:
    """The backend, the gateway's URL and the gateway (run `under` a tool, if given)."""
    upstream, port = free_port(), free_port()
    (tmp / "policy.yaml").write_text(bench_policy(upstream))
    backend = start([sys.executable, str(HERE / "fast_upstream.py"), "--port", str(upstream)], tmp / "up.log")
    serve = ["serve", "--policy", str(tmp / "policy.yaml"), "--port", str(port),
             "--compiled", "off" if args.sources else "require"]
    env = {**os.environ, "SPECGATE_LOG_LEVEL": "info", "SPECGATE_PROFILE_OUT": str(tmp / "serve.prof")}
    env = {k: v for k, v in env.items() if k != "SPECGATE_STATE_URL" and not k.startswith("OTEL_")}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--profiled-serve", *serve] if profiled else \
        [sys.executable, "-m", "specgate.cli", *serve]
    gateway = start([*(under or []), *cmd], tmp / "gateway.log", env=env, cwd=ROOT)
    wait_port(upstream)
    wait_port(port, timeout=30.0 if under is None else 300.0)  # under valgrind: tens of times slower
    return backend, f"http://127.0.0.1:{port}/v1/chat/completions", gateway


def load(args: argparse.Namespace, url: str, seconds: float) -> dict:
    return asyncio.run(run_aiohttp(url, args.concurrency, seconds, args.mode == "stream", body(args.prompt_chars)))


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.terminate()
        proc.wait(30)


def profile_calls(args: argparse.Namespace, tmp: Path) -> tuple[pstats.Stats, int]:
    backend, url, gateway = serving(args, tmp, profiled=True)
    try:
        load(args, url, args.warmup)
        gateway.send_signal(BEGIN)
        time.sleep(0.2)  # the handler runs between two of the server's bytecodes
        measured = load(args, url, args.duration)
        gateway.send_signal(END)
        deadline = time.monotonic() + 30
        while not (tmp / "serve.prof").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # written whole
        if measured["errors"]:
            sys.exit(f"{measured['errors']} requests failed: see the server's log")
    finally:
        stop(gateway, backend)
    return pstats.Stats(str(tmp / "serve.prof")), measured["requests"]


def calls_table(stats: pstats.Stats, requests: int, top: int) -> str:
    rows = []
    for (file, line, name), (_, calls, *_rest) in stats.stats.items():  # type: ignore[attr-defined]  # pstats does not declare `stats`
        if file != "~":  # "~": a builtin, called from somewhere already counted
            rows.append((calls, f"{_short(file)}:{line} {name}"))
    rows.sort(reverse=True)
    lines = ["| calls a request | interpreted function |", "|---|---|"]
    lines += [f"| {calls / requests:.2f} | `{where}` |" for calls, where in rows[:top]]
    lines.append(f"| {sum(calls for calls, _ in rows) / requests:.1f} | all of them |")
    return "\n".join(lines)


def _short(file: str) -> str:
    for marker in ("site-packages/", f"{ROOT}/"):
        if marker in file:
            return file.split(marker, 1)[1]
    if "/lib/python" in file:  # the standard library's
        return file.split("/lib/python", 1)[1].split("/", 1)[-1]
    return file


def perf_table(args: argparse.Namespace, tmp: Path) -> str:
    if shutil.which("perf") is None:
        return "perf is not installed: no samples by shared object"
    backend, url, gateway = serving(args, tmp, profiled=False)
    try:
        load(args, url, args.warmup)
        record = subprocess.Popen(["perf", "record", "-F", "999", "-p", str(gateway.pid), "-o", str(tmp / "perf.data")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        load(args, url, args.duration)
        record.send_signal(signal.SIGINT)
        record.wait(60)
    finally:
        stop(gateway, backend)
    lines = ["| share of the server's CPU samples | shared object or function |", "|---|---|"]
    lines += [f"| {share} | `{what}` |" for share, what in _perf_rows(tmp / "perf.data", "dso")[:10]]
    functions = _perf_rows(tmp / "perf.data", "sym")
    lines += [f"| {share} | `{what}` (the interpreter's own frames) |"
              for share, what in functions if what.endswith("_PyEval_EvalFrameDefault")]
    if args.symbols:
        lines += ["", "| share of the server's CPU samples | function |", "|---|---|"]
        lines += [f"| {share} | `{what}` |" for share, what in functions[:args.symbols]]
    return "\n".join(lines)


def callgrind_table(args: argparse.Namespace, tmp: Path) -> str:
    """Instructions a request of the server, counted by callgrind only while the measured load runs.
    The latency model refits a pair at most every 0.1 s of the wall clock, so under valgrind (tens
    of times slower) its refits run that much more often a request: their row says how much."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return "valgrind is not installed: no instructions counted"
    out = tmp / "callgrind.out"
    backend, url, gateway = serving(args, tmp, profiled=False, under=[
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"])
    try:
        load(args, url, args.warmup)
        subprocess.run(["callgrind_control", "-i", "on", str(gateway.pid)], check=True, capture_output=True)
        requests = load(args, url, args.duration)["requests"]
        subprocess.run(["callgrind_control", "-d", str(gateway.pid)], check=True, capture_output=True)
    finally:
        stop(gateway, backend)
    dumps = sorted(tmp.glob("callgrind.out.*"))
    report = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(dumps[-1])],
                            capture_output=True, text=True, check=True).stdout
    total, rows = 0, {}
    for line in report.splitlines():
        count, _, where = line.strip().partition(" ")
        if not count[:1].isdigit():
            continue
        value = int(count.replace(",", ""))
        if "PROGRAM TOTALS" in where:
            total = value
        elif "CPyDef_" in where:
            name = where.split("CPyDef_", 1)[1].split()[0].replace("_____mypyc_generator_helper__", "")
            rows[name] = max(rows.get(name, 0), value)  # a recursive call is listed again, with less
    lines = [f"instructions a request, {requests} requests under callgrind ({args.mode}, {args.concurrency} "
             f"connections): {total / requests / 1000:.0f}k in all, the latency model's refits "
             f"{rows.get('latency___LatencyModel____current', 0) / requests / 1000:.0f}k of them",
             "", "| k instructions a request, callees included | compiled function |", "|---|---|"]
    top = sorted(rows.items(), key=lambda row: -row[1])[:args.callgrind]
    lines += [f"| {value / requests / 1000:.1f} | `{name}` |" for name, value in top]
    return "\n".join(lines)


def _perf_rows(data: Path, key: str) -> list[tuple[str, str]]:
    report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--sort", key, "--no-children"],
                            capture_output=True, text=True, check=True).stdout
    rows = (line.split(None, 1) for line in report.splitlines() if line.strip() and not line.startswith("#"))
    return [(row[0], row[1].strip()) for row in rows if len(row) == 2 and row[0].endswith("%")]


if __name__ == "__main__":
    main()
