"""The gateway app's own CPU per request, in one process, without an HTTP server in front.

The app (`create_app`, the default policy with both pools on a fast fake backend
and admission limits lifted, as in bench/overhead.py) is called as ASGI with a
chat completion request, non-streamed or streamed (16 SSE chunks), by
`--concurrency` callers at once. It forwards each request over loopback to
bench/fast_upstream.py, so the backend's sockets, the log line (written to
/dev/null), the metrics and the routing decision are all in; uvicorn's HTTP
parsing and the client's socket are not. Per request: the CPU time of this
process's event loop thread (the caller's share is a dict and two awaits).

Without the server's parsing and the load generator on the same two cores, one
round of this spreads far less than a round of bench/overhead.py, so a change to
the request path shows here first. `--baseline REF` runs the same measure on the
app as of git commit REF (exported to a temporary folder), interleaved round by
round. The app runs on uvloop where it is installed, as `specgate serve` does under
uvicorn; `--loops asyncio,uvloop` runs it on each event loop, side by side. Once
started, the collector is tuned as `specgate serve` tunes it (specgate/server.py).

    python bench/request_path.py [--requests 4000] [--rounds 5] [--concurrency 1,32] [--baseline REF]
    python bench/request_path.py --modes stream --profile   # and where the time went, by self time
    python bench/request_path.py --compiled   # and the app with its request path compiled (`specgate compile`)
    python bench/request_path.py --instructions --modes json --rounds 2 --requests 500
    python bench/request_path.py --instructions --event I1mr --compiled   # L1 instruction-cache misses

`--instructions` counts instructions instead of timing: each target runs under valgrind's callgrind
with its instrumentation on only while a round's requests run, and a row gives thousands of
instructions per request. A count does not move with the host's load, so two codes differ by what
they do, not by what else ran: a change of a percent shows, where CPU time spreads by ten. It is
about 50 times slower, so a few hundred requests a round do; streams vary by a few percent with
how the backend's events arrive in reads, a non-streamed request by a fraction of one.

`--event` counts another of callgrind's events per request instead, with its simulation of the
caches (32 KB L1 caches, 8-way) and of branch prediction on: where a request's cycles go beyond its
instructions. Its predictors are simpler than a CPU's, so its mispredicted branches are an upper bound.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import importlib.util
import itertools
import json
import math
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BODY = {"model": "bench", "messages": [{"role": "user", "content": "Write a haiku about rivers."}],
        "temperature": 0, "max_tokens": 128}


def scope_for(body: bytes) -> dict[str, Any]:
    """The scope `specgate serve`'s protocol gives a request, with its extensions (the
    relay then watches the client through them, not through a task on `receive`)."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080),
            "headers": [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "extensions": _extensions()}


@functools.cache
def _extensions() -> dict[str, Any]:
    from gateway.upstream.relay import ABORT_EXTENSION, DISCONNECT_EXTENSION

    extensions: dict[str, Any] = {ABORT_EXTENSION: _never, DISCONNECT_EXTENSION: _never}
    try:
        from gateway.edge.body import BODY_IN_EXTENSION
        extensions[BODY_IN_EXTENSION] = _whole
    except ImportError:  # a baseline from before the server told that the body is in
        pass
    return extensions


def _never(*_: Any) -> None:
    """The client is never lost nor aborted here."""


def _whole() -> bool:
    """The body is always whole here, as a small one is under the server: it came with the head."""
    return True


async def call(app: Any, body: bytes) -> int:
    """One request through the app; its status (the answer's bytes are dropped, as a socket would take them)."""
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays: no disconnect
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope_for(body), receive, send)
    return status


EVENTS = {"Ir": "instructions", "I1mr": "L1 instruction-cache misses", "D1mr": "L1 data-cache read misses",
          "D1mw": "L1 data-cache write misses", "Bcm": "mispredicted conditional branches",
          "Bim": "mispredicted indirect branches"}
SIMULATED = ["--cache-sim=yes", "--branch-sim=yes"]  # what callgrind needs to count any event but Ir


class Instructions:
    """This process's count of `event` (instructions by default), by callgrind while `on` (the process
    runs under `valgrind --tool=callgrind --instr-atstart=no`; callgrind_control switches it)."""

    def __init__(self, out: Path, event: str = "Ir") -> None:
        self.pid = str(os.getpid())
        self.out = out  # the --callgrind-out-file the parent gave, with %p as this pid
        self.event = event
        self.dumps = 0

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, self.pid], check=True, capture_output=True)

    def on(self) -> None:
        self._control("--zero")
        self._control("--instr=on")

    def off(self) -> int:
        """The count since `on`."""
        self._control("--instr=off")
        self._control("--dump")
        self.dumps += 1
        dump = Path(str(self.out).replace("%p", self.pid) + f".{self.dumps}").read_text().splitlines()
        events = next(line for line in dump if line.startswith("events:")).split()[1:]
        totals = next(line for line in dump if line.startswith("totals:")).split()[1:]
        return int(totals[events.index(self.event)]) if self.event in events[:len(totals)] else 0


async def measure(app: Any, stream: bool, concurrency: int, requests: int,
                  counter: Instructions | None = None) -> tuple[float, int]:
    """CPU µs per request of this thread over `requests` requests (with `counter`: thousands
    of instructions per request, counted by callgrind), and how many failed."""
    body = json.dumps({**BODY, "stream": stream}).encode()
    left = requests
    failed = 0

    async def caller() -> None:
        nonlocal left, failed
        while left > 0:
            left -= 1
            if await call(app, body) != 200:
                failed += 1

    if counter is not None:  # instructions in thousands, any other event one by one
        counter.on()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return counter.off() / (1000 if counter.event == "Ir" else 1) / requests, failed
    start = time.thread_time()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return 1e6 * (time.thread_time() - start) / requests, failed


async def run_rounds(policy: Path, args: argparse.Namespace, out: Any) -> None:
    """Every mode and concurrency, `args.rounds` times, one JSON line each to `out`
    (a baseline's rounds are driven line by line by the parent)."""
    from gateway.edge.app import create_app
    from gateway.logs import configure_logging
    from gateway.settings import Settings

    configure_logging("info")  # the parent sends this process's stderr to /dev/null
    app = create_app(Settings(policy=policy))
    if args.callgrind_out is not None:
        _as_served(app)
    async with app.router.lifespan_context(app):
        try:  # the collector as `specgate serve` leaves it once started
            from specgate.server import tune_collector
        except ImportError:  # a baseline from before serve tuned it: as that serve ran
            pass
        else:
            tune_collector()
        for mode in args.modes.split(","):
            for concurrency in args.concurrency:
                await measure(app, mode == "stream", concurrency, min(args.requests, 500))  # warm
        profile = cProfile.Profile() if args.profile else None
        counter = Instructions(args.callgrind_out, args.event) if args.callgrind_out is not None else None
        for _ in range(args.rounds):
            for mode in args.modes.split(","):
                for concurrency in args.concurrency:
                    if args.lockstep:  # wait for the parent's word, so that targets alternate
                        sys.stdin.readline()
                    if profile is not None:
                        profile.enable()
                    cost, failed = await measure(app, mode == "stream", concurrency, args.requests, counter)
                    if profile is not None:
                        profile.disable()
                    print(json.dumps({"mode": mode, "concurrency": concurrency, "per_request": cost,
                                      "failed": failed}), file=out, flush=True)
        if profile is not None:
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)


def _as_served(app: Any) -> None:
    """Under callgrind the app runs some fifty times slower than served, so work done at most
    every so often (the latency model's refit, at most every 0.1 s) would come fifty times as
    often per request, and as often as the host's speed let it: counts would move by a tenth
    between rounds of the same code. Served, a refit comes once in hundreds of requests; here,
    not at all in the rounds counted."""
    model = getattr(getattr(app.state, "parts", None), "latency", None)
    if model is not None and hasattr(model, "refit_s"):
        model.refit_s = math.inf


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000, help="requests per round (default 4000)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="json,stream", help="json (non-streamed), stream, or both")
    parser.add_argument("--concurrency", type=lambda text: [int(c) for c in text.split(",")], default=[1, 32])
    parser.add_argument("--baseline", metavar="REF", help="also measure the app as of this git commit")
    served = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"  # as uvicorn's `loop: auto` picks
    parser.add_argument("--loops", type=_loops, default=[served], metavar="LOOP[,LOOP]",
                        help="the event loops to run the app on, each a target: uvloop and/or asyncio "
                             f"(default: {served}, the one `specgate serve` runs on here)")
    parser.add_argument("--compiled", action="store_true", help="also measure the app with its request path compiled "
                        "(`specgate compile`: the build in build/compiled must match the sources); with --baseline, "
                        "the baseline with its own build as well")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of each target's rounds")
    parser.add_argument("--instructions", action="store_true",
                        help="count thousands of instructions per request under valgrind's callgrind instead "
                             "of timing (Debian's valgrind; about 50x slower: use a few hundred requests)")
    parser.add_argument("--event", choices=list(EVENTS), default="Ir",
                        help="with --instructions, the callgrind event counted per request: "
                             + ", ".join(f"{k} ({v})" for k, v in EVENTS.items())
                             + "; any but Ir turns on its cache and branch simulation (default Ir)")
    parser.add_argument("--top", type=int, default=40, help="rows of the profile (default 40)")
    parser.add_argument("--policy", type=Path, help=argparse.SUPPRESS)  # a baseline's, from the parent
    parser.add_argument("--lockstep", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--use-compiled", action="store_true", help=argparse.SUPPRESS)  # a target's, from the parent
    parser.add_argument("--callgrind-out", type=Path, help=argparse.SUPPRESS)  # a target's under callgrind
    return parser.parse_args(argv)


def runner(loop: str) -> asyncio.Runner:
    """A runner on the event loop named."""
    if loop == "uvloop":
        import uvloop
        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()


def _loops(text: str) -> list[str]:
    loops = list(dict.fromkeys(text.split(",")))  # a loop named twice is one target, not two of one name
    unknown = set(loops) - {"asyncio", "uvloop"}
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown event loop(s) {', '.join(sorted(unknown))}: "
                                         "choose asyncio and/or uvloop")
    return loops


def pin(index: int) -> Any:
    """Run a child on one CPU of those this process may use (the backend on the first, the
    apps on the last): the scheduler then never moves the app's thread between cores, or
    puts the backend beside it, mid-round. None where there is one CPU or no affinity."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return None
    return lambda: os.sched_setaffinity(0, {cpus[index]})


def main() -> None:
    args = parse_args()
    if args.policy is not None:  # a target of the parent's, one JSON line per round
        if args.use_compiled:
            from specgate.compiled import use_compiled
            use_compiled("require")
        with runner(args.loops[0]) as run:
            run.run(run_rounds(args.policy, args, sys.stdout))
        return
    refuse_what_cannot_run(args)
    if args.compiled:
        from specgate.compiled import default_build_dir, read_build
        if not read_build(default_build_dir(ROOT), ROOT)[0]:
            sys.exit(f"--compiled: {read_build(default_build_dir(ROOT), ROOT)[1]}")
    sys.path.insert(0, str(HERE))
    from baseline import compile_tree, export_tree
    from overhead import bench_policy, free_port, wait_port

    tmp = Path(tempfile.mkdtemp(prefix="specgate-request-path-"))
    port = free_port()
    backend = subprocess.Popen([sys.executable, str(HERE / "fast_upstream.py"), "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin(0))
    targets: dict[str, subprocess.Popen] = {}
    try:
        wait_port(port)
        policy = tmp / "policy.yaml"
        policy.write_text(bench_policy(port))
        trees = {"gateway": ROOT, **({"gateway (compiled)": ROOT} if args.compiled else {})}
        if args.baseline:
            trees["baseline"] = export_tree(args.baseline, tmp / "baseline")
            if args.compiled and compile_tree(trees["baseline"], dict(os.environ)):
                trees["baseline (compiled)"] = trees["baseline"]
        passed = [f"--requests={args.requests}", f"--rounds={args.rounds}", f"--modes={args.modes}",
                  "--concurrency=" + ",".join(map(str, args.concurrency)), f"--top={args.top}", f"--event={args.event}",
                  *(["--profile"] if args.profile else [])]
        for index, ((name, tree), loop) in enumerate(itertools.product(trees.items(), args.loops)):
            out = tmp / f"callgrind-{index}.%p"
            under = ["valgrind", "--tool=callgrind", *(SIMULATED if args.event != "Ir" else []),
                     "--instr-atstart=no", f"--callgrind-out-file={out}",
                     "--log-file=" + str(tmp / f"valgrind-{index}.log")] if args.instructions else []
            targets[name if len(args.loops) == 1 else f"{name} ({loop})"] = subprocess.Popen(
                [*under, sys.executable, str(HERE / "request_path.py"), *passed, f"--policy={policy}", "--lockstep",
                 f"--loops={loop}", *(["--use-compiled"] if name.endswith("(compiled)") else []),
                 *([f"--callgrind-out={out}"] if args.instructions else [])],
                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=pin(-1))
        rows = interleave(targets, args)
        if args.profile:
            for name, proc in targets.items():
                print(f"## {name}\n{proc.stdout.read()}")
    finally:
        for proc in (*targets.values(), backend):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    unit = "µs/req" if not args.instructions else "k instructions/req" if args.event == "Ir" else f"{args.event}/req"
    print(table(rows, list(targets), unit))


def refuse_what_cannot_run(args: argparse.Namespace) -> None:
    if args.instructions and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        sys.exit("--instructions needs valgrind and callgrind_control: apt-get install -y valgrind")
    if args.instructions and args.profile:
        sys.exit("--instructions and --profile measure different things: ask for one of them")
    if args.event != "Ir" and not args.instructions:
        sys.exit(f"--event {args.event} is counted by callgrind: ask for --instructions as well")


def interleave(targets: dict[str, subprocess.Popen], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each target's rounds, one at a time in turn: the host's noise falls on all alike."""
    rows = []
    steps = args.rounds * len(args.modes.split(",")) * len(args.concurrency)
    for step in range(steps):
        for name, proc in targets.items():
            try:
                proc.stdin.write("\n")
                proc.stdin.flush()
            except BrokenPipeError:
                raise RuntimeError(f"{name} stopped before its round {step + 1} of {steps}") from None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{name} stopped before its round {step + 1} of {steps}")
            rows.append({"target": name, **json.loads(line)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]], targets: list[str], unit: str = "µs/req") -> str:
    lines = ["| mode | concurrency | " + " | ".join(f"{t} {unit} (rounds)" for t in targets)
             + " | " + " | ".join(f"{t} median" for t in targets) + " | failed |",
             "|---|---|" + "---|" * (2 * len(targets) + 1)]
    keys = dict.fromkeys((row["mode"], row["concurrency"]) for row in rows)
    for mode, concurrency in keys:
        mine = {t: [r["per_request"] for r in rows
                    if (r["mode"], r["concurrency"], r["target"]) == (mode, concurrency, t)] for t in targets}
        failed = sum(r["failed"] for r in rows if (r["mode"], r["concurrency"]) == (mode, concurrency))
        lines.append(f"| {mode} | {concurrency} | "
                     + " | ".join(", ".join(f"{v:.0f}" for v in mine[t]) for t in targets) + " | "
                     + " | ".join(f"{statistics.median(mine[t]):.0f}" for t in targets) + f" | {failed} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
