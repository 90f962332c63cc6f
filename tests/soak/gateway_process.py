"""The gateway as the product runs it: `python -m specgate.cli serve` in a child
process, so its memory and open files can be read from /proc while a test
drives it over loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from tests.fakes.process import REPO_ROOT, free_port

SAMPLE = re.compile(r'^(specgate_\w+)\{([^}]*)\} (\S+)$', re.MULTILINE)


def one_pool_policy(directory: Path, pool: dict) -> Path:
    """Write a policy that sends every request to `pool` (a standard pool); its path."""
    policy = {"version": 1, "pools": {"standard": {"kind": "standard", **pool}},
              "rules": [{"name": "all", "route": "standard"}], "guard": {"enabled": False}}
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


class GatewayProcess:
    """`specgate serve --policy POLICY --port PORT`, its log in `log_path`."""

    def __init__(self, policy: Path, log_path: Path, env: dict[str, str] | None = None,
                 port: int | None = None) -> None:
        self.policy = policy
        self.log_path = log_path
        self.env = env or {}
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60.0) -> GatewayProcess:  # a hang guard: it starts in about a second
        python_path = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in python_path if p), **self.env}
        command = [sys.executable, "-m", "specgate.cli", "serve", "--policy", str(self.policy),
                   "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}: {self.log()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gateway on {self.url} did not become ready: {self.log()[-2000:]}")

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time; the exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()  # SIGKILL always ends it; a loaded machine may take its time to say so
        return process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    # What /proc says ------------------------------------------------------

    def rss_bytes(self) -> int:
        status = Path(f"/proc/{self.pid}/status").read_text()
        kib = re.search(r"^VmRSS:\s+(\d+) kB$", status, re.MULTILINE)
        assert kib is not None
        return int(kib.group(1)) * 1024

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    # What the gateway says -------------------------------------------------

    def samples(self, metric: str) -> dict[str, float]:
        """The gateway's samples of `metric`, keyed by their label values joined with '/'."""
        text = httpx.get(f"{self.url}/metrics", timeout=5.0).text
        return {"/".join(re.findall(r'="([^"]*)"', labels)): float(value)
                for name, labels, value in SAMPLE.findall(text) if name == metric}
