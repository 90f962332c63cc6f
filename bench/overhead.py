"""What the gateway adds: the same load straight to a fast fake backend, through nginx, and through specgate,
interleaved in one run.

Three modes: `wrk` (non-streamed, driven by wrk), `json` (non-streamed) and `stream` (16 SSE chunks), both
driven by an aiohttp client. Each round runs every target once per concurrency level, so machine noise hits
all three alike; the reported numbers are medians over rounds. Needs Debian's nginx and wrk.

    python bench/overhead.py --concurrency 1,32,128 --duration 5 --rounds 3

`--baseline REF` adds a fourth target: the gateway as of git commit REF (exported to a temporary folder),
interleaved with the others, so a change's cost is measured against the code before it under the same noise;
a last table then lists each round's CPU a request of both, the spread the medians hide.

Every row also says how much CPU the target's own processes (the gateway and its workers, nginx's master and
worker, the backend for `direct`) spent per request served in that window: user + system time from
/proc/PID/stat, over the requests the load generator completed.

`--state-url URL` (or `--start-redis`, which starts a redis-server of its own) adds `gateway+state`: the same
gateway with SPECGATE_STATE_URL set, so what sharing state costs the request path is measured against
`gateway` in the same rounds. `--workers N[,M...]` adds `gateway+state xN` for each count over 1: `specgate
serve --workers N` on that store, the series of how throughput grows with processes.

    python bench/overhead.py --modes wrk --concurrency 1,32 --start-redis --workers 2,4

`--compiled` runs every gateway target with its request path compiled (`specgate compile`; `serve --compiled
require`) and adds `gateway (sources)` beside them; without it they run the sources (`--compiled off`). A
`--baseline` then runs its own build too, compiled in its tree, as that commit shipped.

`--granian` adds `gateway (granian)`: the same app served by granian (`pip install granian`;
bench/granian_app.py), one worker, uvloop.

`--prompt-chars N` sends a prompt of N characters instead of the one short sentence, so what a long prompt
costs (the body's parse, the domain classifier, the prefix keys) shows in every target alike.

`--tracing` adds `gateway+tracing`: the same gateway exporting a span per request (OTEL_EXPORTER_OTLP_ENDPOINT)
to an OTLP receiver of its own (bench/otlp_sink.py), so what tracing costs is measured against `gateway`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import compile_tree, export_tree  # noqa: E402 (the sibling modules)
from overhead_tables import markdown, rounds_markdown, summarize  # noqa: E402 (the sibling module)
from proc_cpu import cpu_seconds, process_tree  # noqa: E402 (the sibling module)

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a haiku about rivers."  # a chat prompt, the default policy's default domain
BODY = {"model": "bench", "messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": 128}


def body(prompt_chars: int) -> dict:
    """The bench's request with a prompt of `prompt_chars` characters: its sentence repeated
    (no domain's keyword or pattern in it, so the classifier searches every one) and cut there."""
    text = " ".join([PROMPT] * (prompt_chars // len(PROMPT) + 1))[:prompt_chars]
    return {**BODY, "messages": [{"role": "user", "content": text}]}


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  upstream backend {{ server 127.0.0.1:{upstream}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = [[{body}]]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, listeners: int = 1, timeout: float = 30.0) -> None:
    """Until `listeners` sockets listen on `port` (several: `serve --workers`, Linux only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0 and (listeners == 1 or listening(port) >= listeners):
                return
        time.sleep(0.05)
    raise RuntimeError(f"{listeners} listener(s) did not appear on port {port}")


def listening(port: int) -> int:
    """How many TCP sockets listen on `port`, from /proc/net/tcp."""
    rows = (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
    return sum(1 for row in rows if row[3] == "0A" and int(row[1].rsplit(":", 1)[1], 16) == port)


def start_redis(tmp: Path) -> tuple[subprocess.Popen, str]:
    """A redis-server on a free loopback port, persistence as the deploy files set it."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("--start-redis needs redis-server: apt-get install -y redis-server")
    port = free_port()
    proc = start([binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(tmp), "--save", "",
                  "--appendonly", "yes", "--appendfsync", "everysec"], tmp / "redis.log")
    wait_port(port)
    return proc, f"redis://127.0.0.1:{port}/0"


def bench_policy(upstream: int) -> str:
    """The default policy (its rules and classifier run for every request), both pools
    on the fast backend, admission limits lifted: this measures proxying, not shedding."""
    text = (ROOT / "policies" / "default.yaml").read_text()
    for port in ("8001", "8002"):
        text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{upstream}")
    lifted, count = re.subn(r"max_in_flight: \d+", "max_in_flight: 100000", text)
    if count == 0:
        raise RuntimeError("policies/default.yaml sets no max_in_flight to lift")
    return lifted


def run_wrk(url: str, concurrency: int, duration: float, script: Path) -> dict:
    argv = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration))}s", "--latency", "-s", str(script), url]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    latency = {p: _ms(v, u) for p, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": latency["50"], "p99_ms": latency["99"],
            "errors": int(errors.group(1)) if errors else 0,
            "requests": int(re.search(r"(\d+) requests in", out).group(1))}


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


async def run_aiohttp(url: str, concurrency: int, duration: float, stream: bool, request: dict = BODY) -> dict:
    import aiohttp

    payload = json.dumps({**request, "stream": stream}).encode()
    complete = b"data: [DONE]\n\n" if stream else b"}"
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            async with session.post(url, data=payload, headers={"content-type": "application/json"}) as resp:
                body = await resp.read()
            if resp.status != 200 or not body.rstrip(b"\n").endswith(complete.rstrip(b"\n")):
                errors += 1
            latencies.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {"rps": len(latencies) / elapsed, "p50_ms": 1000 * latencies[len(latencies) // 2],
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            "errors": errors, "requests": len(latencies)}


def start(cmd: list[str], log: Path, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"), env=env, cwd=cwd,
                            start_new_session=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,32,128")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="wrk,json,stream")
    parser.add_argument("--baseline", metavar="REF", help="also run the gateway as of this git commit")
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--state-url", metavar="URL", help="also run the gateway with this SPECGATE_STATE_URL")
    store.add_argument("--start-redis", action="store_true",
                       help="start a redis-server and run the gateway with it as well")
    parser.add_argument("--workers", default="1", metavar="N[,M...]",
                        help="also run `serve --workers N` on the state store for each N over 1 "
                             "(needs one of the two above)")
    parser.add_argument("--tracing", action="store_true",
                        help="also run the gateway with OpenTelemetry traces exported to a local receiver")
    parser.add_argument("--compiled", action="store_true", help="run the gateways with the request path compiled "
                        "(`specgate compile`), and the sources beside them as `gateway (sources)`")
    parser.add_argument("--granian", action="store_true", help="also serve the app with granian (pip install granian)")
    parser.add_argument("--prompt-chars", type=int, default=len(PROMPT), metavar="N",
                        help=f"the prompt's length in characters (default {len(PROMPT)}: one short sentence; a "
                             "longer one repeats it, to show what the body's parse and the classifier cost)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "overhead.json")
    args = parser.parse_args()
    if args.prompt_chars < 1:
        parser.error("--prompt-chars must be at least 1")
    args.workers = [int(n) for n in args.workers.split(",") if int(n) > 1]
    if args.workers and not (args.state_url or args.start_redis):
        parser.error("--workers needs --state-url or --start-redis")
    return args


def main() -> None:
    args = parse_args()
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            sys.exit(f"{tool} is needed: apt-get install -y nginx wrk")
    if args.granian and not Path(sys.executable).with_name("granian").exists():
        sys.exit("--granian needs granian beside this Python: pip install granian")
    tmp = Path(tempfile.mkdtemp(prefix="specgate-overhead-"))
    script = tmp / "post.lua"
    request = body(args.prompt_chars)
    script.write_text(WRK_SCRIPT.format(body=json.dumps(request)))
    procs: list[subprocess.Popen] = []
    results: dict = {"duration_s": args.duration, "rounds": args.rounds, "cpus": os.cpu_count(),
                     "prompt_chars": args.prompt_chars, "runs": []}
    try:
        targets = start_targets(args, tmp, procs)
        for port, listeners, _ in targets.values():
            wait_port(port, listeners)
        trees = {target: process_tree(pid) for target, (_, _, pid) in targets.items()}
        for mode in args.modes.split(","):
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                for port, _, _ in targets.values():  # warm up connections and code paths
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
                    measure(mode, url, concurrency, 1.0, script, request)
                for round_no in range(args.rounds):
                    for target, (port, _, _) in targets.items():
                        url = f"http://127.0.0.1:{port}/v1/chat/completions"
                        before = cpu_seconds(trees[target])
                        row = measure(mode, url, concurrency, args.duration, script, request)
                        row["cpu_us"] = 1e6 * (cpu_seconds(trees[target]) - before) / max(1, row["requests"])
                        row.update(mode=mode, concurrency=concurrency, target=target, round=round_no)
                        results["runs"].append(row)
                        print(json.dumps(row), flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
    results["summary"] = summarize(results["runs"])
    if args.tracing:
        results["spans_exported"] = exported_spans(tmp / "otlp.log")
        print(f"spans the receiver decoded: {results['spans_exported']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(markdown(results["summary"]))
    if args.baseline:
        print("\n" + rounds_markdown(results["runs"]))


def start_targets(args: argparse.Namespace, tmp: Path,
                  procs: list[subprocess.Popen]) -> dict[str, tuple[int, int, int]]:
    """Start the backend, nginx and every gateway asked for (appended to `procs`);
    each target's (port, listening sockets to wait for, process id of its tree's root)."""
    upstream, nginx_port = free_port(), free_port()
    (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, upstream=upstream, port=nginx_port))
    (tmp / "policy.yaml").write_text(bench_policy(upstream))
    env = {**os.environ, "SPECGATE_LOG_LEVEL": "info"}
    env.pop("SPECGATE_STATE_URL", None)  # `gateway` runs alone, as without a store
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}  # and untraced

    def launch(port: int, listeners: int, cmd: list[str], log: str, **kwargs: Any) -> tuple[int, int, int]:
        procs.append(start(cmd, tmp / log, **kwargs))
        return port, listeners, procs[-1].pid

    def serve(log: str, *extra: str, workers: int = 1, compiled: bool = args.compiled,
              **more_env: str) -> tuple[int, int, int]:
        port, policy, mode = free_port(), str(tmp / "policy.yaml"), "require" if compiled else "off"
        return launch(port, workers, [sys.executable, "-m", "specgate.cli", "serve", "--policy", policy, "--port",
                                      str(port), "--compiled", mode, *extra], log, env={**env, **more_env})

    targets = {
        "direct": launch(upstream, 1, [sys.executable, str(ROOT / "bench" / "fast_upstream.py"), "--port",
                                       str(upstream)], "up.log"),
        "nginx": launch(nginx_port, 1, [shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(tmp / "nginx.conf")],
                        "nginx.log"),
        "gateway": serve("gateway.log"),
        **({"gateway (sources)": serve("gateway-sources.log", compiled=False)} if args.compiled else {}),
    }
    if args.baseline:
        tree = export_tree(args.baseline, tmp / "baseline")
        port = free_port()
        cli = "specgate.cli" if (tree / "specgate" / "cli.py").exists() else "gateway.cli"  # before the layout by stage
        compiled = args.compiled and compile_tree(tree, env)
        targets["baseline"] = launch(port, 1, [sys.executable, "-m", cli, "serve", "--policy",
                                               str(tmp / "policy.yaml"), "--port", str(port),
                                               *(["--compiled", "require"] if compiled else [])], "baseline.log",
                                     env={**env, "PYTHONPATH": str(tree)}, cwd=tree)
    state_url = args.state_url
    if args.start_redis:
        redis, state_url = start_redis(tmp)
        procs.append(redis)
    if state_url:
        targets["gateway+state"] = serve("gateway-state.log", SPECGATE_STATE_URL=state_url)
        for workers in args.workers:
            targets[f"gateway+state x{workers}"] = serve(f"gateway-workers{workers}.log", "--workers", str(workers),
                                                         workers=workers, SPECGATE_STATE_URL=state_url)
    if args.granian:
        port = free_port()
        targets["gateway (granian)"] = launch(port, 1, [
            str(Path(sys.executable).with_name("granian")), "--interface", "asgi", "--factory", "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1", "--loop", "uvloop", "--no-ws", "--log-level", "warning",
            "granian_app:gateway"], "gateway-granian.log",
            env={**env, "SPECGATE_POLICY": str(tmp / "policy.yaml"), "PYTHONPATH": str(ROOT / "bench")})
    if args.tracing:
        sink = free_port()
        procs.append(start([sys.executable, str(ROOT / "bench" / "otlp_sink.py"), "--port", str(sink)],
                           tmp / "otlp.log"))
        targets["gateway+tracing"] = serve("gateway-tracing.log", OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{sink}")
    return targets


def exported_spans(log: Path) -> int:
    """The receiver's last count (spans of the last batch may be left when it stops first)."""
    counts = re.findall(r"^spans (\d+)$", log.read_text(), re.M) if log.exists() else []
    return int(counts[-1]) if counts else 0


def measure(mode: str, url: str, concurrency: int, duration: float, script: Path, request: dict) -> dict:
    if mode == "wrk":
        return run_wrk(url, concurrency, duration, script)
    return asyncio.run(run_aiohttp(url, concurrency, duration, mode == "stream", request))


if __name__ == "__main__":
    main()
