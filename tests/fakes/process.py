"""A fake vLLM in a child process, for tests that kill and restart backends,
and the two helpers any test that runs a project module as a process needs."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from backends.serving.server import bind_socket

REPO_ROOT = Path(__file__).resolve().parents[2]


LOWEST_PORT = 10000  # below it: the well-known and registered ports services use (8080, 9090, ...)
_PORTS = random.SystemRandom()  # not the `random` module's state, which a test may seed


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, outside the kernel's ephemeral range. A port from that range can
    be taken, before the server handed it binds it, by any process's outgoing connection
    or port-0 bind: vLLM makes many in the minutes it loads, and once a gateway started
    after it found its port in use. Where no such range can be read or none lies below
    it, the kernel's choice."""
    below = _ephemeral_start()
    for _ in range(100 if below > LOWEST_PORT else 0):
        port = _PORTS.randrange(LOWEST_PORT, below)
        try:
            with bind_socket(host, port):
                return port
        except OSError:
            continue
    with bind_socket(host, 0) as sock:
        return int(sock.getsockname()[1])


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def spawn_module(module: str, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
    """`python -m module args...` from the repository root, importable as in tests."""
    python_path = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in python_path if p)}
    env.update(popen.pop("env", {}))
    popen.setdefault("stdout", subprocess.DEVNULL)
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env, **popen)


def wait_until_ok(url: str, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Poll `url` until it answers 200; raise if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=0.5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s")


class FakeVllmProcess:
    """`python -m tests.fakes.vllm_command --port PORT ARGS...` with start/kill/restart.

    `args` are extra command-line options, e.g. `("--kind", "standard", "--delay", "0.01")`.
    """

    def __init__(self, *args: str, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> FakeVllmProcess:
        address = ("--host", self.host, "--port", str(self.port))
        self.process = spawn_module("tests.fakes.vllm_command", *address, *self.args)
        try:
            wait_until_ok(f"{self.url}/health", self.process, timeout)
        except RuntimeError:
            self.kill()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL: connections drop without a goodbye, like a crashed backend."""
        self._end(signal.SIGKILL)

    def terminate(self) -> None:
        self._end(signal.SIGTERM)

    def restart(self) -> None:
        self.kill()
        self.start()

    def _end(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:  # SIGTERM not heeded in time
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> FakeVllmProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.terminate()
