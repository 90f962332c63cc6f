"""`specgate serve` replicas as child processes on one Redis, each on its own
fixed port (so a restart comes back where it was), for the tests of shared
overrides and of serving through a store outage."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.fakes.process import free_port, spawn_module, wait_until_ok

ADMIN_TOKEN = "replica-admin-token"
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def write_policy(path: Path, spec_url: str, std_url: str) -> Path:
    """Two pools, greedy requests to the speculative one; the guard off, so only
    the overrides move the flags."""
    pool = {"timeouts": {"connect_s": 1, "first_byte_s": 10, "total_s": 30},
            "health": {"interval_s": 0.5, "eject_after": 3, "backoff_s": 0.5, "max_backoff_s": 2}}
    policy = {
        "version": 1,
        "pools": {
            "speculative": {"kind": "speculative", "endpoints": [{"url": spec_url}], "model": "upstream-spec",
                            "fallback": "standard", **pool},
            "standard": {"kind": "standard", "endpoints": [{"url": std_url}], "model": "upstream-std", **pool},
        },
        "rules": [{"name": "default", "route": "speculative"}],
        "guard": {"enabled": False},
    }
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


class ServeReplica:
    def __init__(self, name: str, policy: Path, state_url: str, log: Path) -> None:
        self.name = name
        self.policy = policy
        self.state_url = state_url
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ServeReplica:
        env = {"SPECGATE_STATE_URL": self.state_url, "SPECGATE_ADMIN_TOKEN": ADMIN_TOKEN}
        with open(self.log, "ab") as out:
            self.process = spawn_module("specgate.cli", "serve", "--policy", str(self.policy), "--host", "127.0.0.1",
                                        "--port", str(self.port), "--log-level", "info", env=env,
                                        stdout=out, stderr=subprocess.STDOUT)
        wait_until_ok(f"{self.url}/healthz", self.process, timeout=60)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def flags(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/admin/flags", headers=AUTH, timeout=10)
        response.raise_for_status()
        flags: dict[str, Any] = response.json()
        return flags

    def put_mode(self, pool: str, mode: str) -> httpx.Response:
        return httpx.put(f"{self.url}/admin/flags/{pool}", headers=AUTH, json={"mode": mode}, timeout=10)

    def metric(self, name: str) -> float | None:
        """One unlabelled sample from /metrics."""
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

