"""`specgate up`: the embedded default, the whole stack on this machine.

Two backends (speculative on 8001, standard on 8002: real vLLM CPU servers
serving the packaged SmolLM2-135M-Instruct, or the project's own engine with
`--engine bundled`), then the gateway with the default policy on 8080. Each
child runs in its own process group and logs to a file under the cache
directory; Ctrl-C or SIGTERM stops them all, SIGKILL after a grace period.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SERVED_MODEL = "smollm2"
SPECULATIVE_PORT, STANDARD_PORT = 8001, 8002
VLLM_CPU_ARGS = ("--dtype", "float32", "--max-model-len", "2048")  # float32: greedy stays exact
START_TIMEOUT_S = 900.0


class StartError(RuntimeError):
    pass


@dataclass
class Service:
    name: str
    argv: list[str]
    health_url: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env={**os.environ, **self.env}, start_new_session=True)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(self.health_url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, grace_s: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        _signal_group(self.process, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.process, signal.SIGKILL)
            self.process.wait(5)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


class Stack:
    """Backends first (all at once, they load in parallel), then the gateway."""

    def __init__(self, backends: Sequence[Service], gateway: Service) -> None:
        self.backends = list(backends)
        self.gateway = gateway

    @property
    def services(self) -> list[Service]:
        return [*self.backends, self.gateway]

    def start(self, timeout_s: float = START_TIMEOUT_S, progress: Callable[[str], None] = print) -> None:
        for service in self.backends:
            service.start()
        wait_healthy(self.backends, timeout_s, progress)
        self.gateway.start()
        wait_healthy([self.gateway], 60.0, progress)

    def wait(self) -> Service:
        """Block until a child exits; returns it."""
        while True:
            for service in self.services:
                if service.exit_code() is not None:
                    return service
            time.sleep(0.5)

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


def wait_healthy(services: Sequence[Service], timeout_s: float, progress: Callable[[str], None]) -> None:
    started = time.monotonic()
    pending = list(services)
    last_report = 0.0
    while pending:
        for service in list(pending):
            code = service.exit_code()
            if code is not None:
                raise StartError(f"{service.name} exited with code {code} while starting; its log: {service.log}")
            if service.healthy():
                pending.remove(service)
                progress(f"  {service.name} ready after {time.monotonic() - started:.0f} s")
        elapsed = time.monotonic() - started
        if pending and elapsed > timeout_s:
            names = ", ".join(f"{s.name} (log: {s.log})" for s in pending)
            raise StartError(f"not ready after {timeout_s:.0f} s: {names}")
        if pending and elapsed - last_report >= 10:
            last_report = elapsed
            progress(f"  loading: {', '.join(s.name for s in pending)} ({elapsed:.0f} s)")
        if pending:
            time.sleep(0.5)


def vllm_backends(model_dir: Path, logs: Path, ports: tuple[int, int] = (SPECULATIVE_PORT, STANDARD_PORT),
                  python: str = sys.executable) -> list[Service]:
    from backends.vllm import load_profiles, render

    _, profiles = load_profiles()
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "HF_HUB_OFFLINE": "1"}
    services = []
    for kind, profile, port in (("speculative", "speculative-ngram", ports[0]), ("standard", "standard", ports[1])):
        argv = render(profiles[profile], model=str(model_dir), port=port, served_model_name=SERVED_MODEL,
                      extra_args=VLLM_CPU_ARGS, python=python)
        services.append(Service(f"vLLM {kind} ({profile}, :{port})", argv, f"http://127.0.0.1:{port}/health",
                                logs / f"vllm-{kind}.log", env))
    return services


def engine_backends(logs: Path, ports: tuple[int, int] = (SPECULATIVE_PORT, STANDARD_PORT),
                    python: str = sys.executable) -> list[Service]:
    from gateway.cli import COMMANDS

    if "engine" not in {name for name, _, _ in COMMANDS}:
        raise StartError("the bundled engine is not part of this build; use --engine vllm")
    services = []
    for kind, port, flags in (("speculative", ports[0], []), ("standard", ports[1], ["--no-speculation"])):
        argv = [python, "-m", "gateway.cli", "engine", "--host", "127.0.0.1", "--port", str(port),
                "--served-model-name", SERVED_MODEL, *flags]
        services.append(Service(f"engine {kind} (:{port})", argv, f"http://127.0.0.1:{port}/health",
                                logs / f"engine-{kind}.log", {"HF_HUB_OFFLINE": "1"}))
    return services


def gateway_service(policy: Path, port: int, logs: Path, python: str = sys.executable) -> Service:
    argv = [python, "-m", "gateway.cli", "serve", "--policy", str(policy), "--host", "127.0.0.1",
            "--port", str(port)]
    return Service(f"gateway (:{port})", argv, f"http://127.0.0.1:{port}/readyz", logs / "gateway.log")


def banner(port: int) -> str:
    base = f"http://127.0.0.1:{port}/v1"
    return f"""
specgate is up: {base}

  curl {base}/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{SERVED_MODEL}", "messages": [{{"role": "user", "content": "Write a haiku"}}], "max_tokens": 128, "temperature": 0}}' -i

  from openai import OpenAI
  client = OpenAI(base_url="{base}", api_key="unused")
  reply = client.chat.completions.with_raw_response.create(model="{SERVED_MODEL}", max_tokens=128, temperature=0,
      messages=[{{"role": "user", "content": "Write a haiku"}}])
  print(reply.headers["x-specgate-pool"], reply.parse().choices[0].message.content)

Ctrl-C stops everything.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=["vllm", "bundled"], default="vllm",
                        help="backends: real vLLM CPU servers (default) or the project's own engine")
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default: %(default)s)")
    parser.add_argument("--policy", type=Path, help="policy (default: policies/default.yaml, which expects "
                        f"the backends on {SPECULATIVE_PORT} and {STANDARD_PORT})")
    parser.add_argument("--cache-dir", help="prepared model and logs (default: $SPECGATE_CACHE_DIR or "
                        "~/.cache/specgate)")


def run(args: argparse.Namespace) -> int:
    from backends.model import cache_dir, prepare
    from gateway.settings import default_policy_path

    cache = cache_dir(args.cache_dir)
    logs = cache / "logs"
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.engine == "vllm":
            print("preparing the model (once) ...", flush=True)
            backends = vllm_backends(prepare(cache), logs)
        else:
            backends = engine_backends(logs)
        stack = Stack(backends, gateway_service(args.policy or default_policy_path(), args.port, logs))
    except StartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"starting the backends (logs in {logs}) ...", flush=True)
    try:
        stack.start(progress=lambda line: print(line, flush=True))
        print(banner(args.port), flush=True)
        stopped = stack.wait()
        print(f"{stopped.name} exited with code {stopped.exit_code()}; its log: {stopped.log}", file=sys.stderr)
        return 1
    except StartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping ...", flush=True)
        return 0
    finally:
        stack.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
