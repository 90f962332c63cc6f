"""`specgate up` as a process of its own, the way a process manager runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from gateway.settings import default_policy_path
from tests.fakes.process import free_port, spawn_module
from tests.integration.up import processes

FAKE_BACKEND = "{python} -m tests.integration.up.backend --port {port} --kind {kind} --model smollm2"


def write_policy(path: Path, backend_ports: tuple[int, ...]) -> Path:
    """The default policy, pointed at `backend_ports`."""
    policy = yaml.safe_load(default_policy_path().read_text())
    for pool, port in zip(("speculative", "standard"), backend_ports, strict=True):
        policy["pools"][pool]["endpoints"] = [{"url": f"http://127.0.0.1:{port}"}]
    path.write_text(yaml.safe_dump(policy))
    return path


class UpProcess:
    """`specgate up` leading a session (and process group) of its own.

    `args` go after `up`; the gateway and backend ports are free ones unless given,
    and the policy the default pointed at them unless given (one port per pool).
    Its stdout and stderr go to files under `work`.
    """

    def __init__(self, work: Path, *args: str, backend_ports: tuple[int, ...] | None = None,
                 port: int | None = None, policy: Path | None = None) -> None:
        self.work = work
        self.port = port or free_port()
        self.backend_ports = backend_ports or (free_port(), free_port())
        self.policy = policy
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        self.seen: list[processes.Proc] = []  # every process found below `up`, for the clean-up
        self.stdout, self.stderr = work / "up.out", work / "up.err"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UpProcess:
        policy = self.policy or write_policy(self.work / "policy.yaml", self.backend_ports)
        ports = ",".join(map(str, self.backend_ports))
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.process = spawn_module(
                "specgate.cli", "up", "--port", str(self.port), "--backend-ports", ports, "--policy", str(policy),
                *self.args, stdout=out, stderr=err, start_new_session=True)
        return self

    def output(self) -> str:
        return f"stdout:\n{self.stdout.read_text()}\nstderr:\n{self.stderr.read_text()}"

    def wait_ready(self, timeout_s: float) -> None:
        """Until `up` says its stack is up (a gateway left over from an earlier
        run may answer /readyz sooner); fails with the output if `up` exits first."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"specgate up exited with {self.process.returncode}\n{self.output()}")
            if "specgate is up" in self.stdout.read_text():
                response = httpx.get(self.url + "/readyz", timeout=5)
                assert response.status_code == 200, response.text
                return
            time.sleep(0.2)
        raise AssertionError(f"the gateway was not ready after {timeout_s:.0f} s\n{self.output()}")

    def ready_or_exited(self, timeout_s: float) -> int | None:
        """None once the gateway is ready, or `up`'s exit code if it exits first."""
        try:
            self.wait_ready(timeout_s)
        except AssertionError:
            if self.process is not None and self.process.poll() is not None:
                return self.process.returncode
            raise
        return None

    def descendants(self) -> list[processes.Proc]:
        assert self.process is not None
        found = processes.descendants(self.process.pid)
        self.seen += [proc for proc in found if proc not in self.seen]
        return found

    def signal_group(self, signum: int) -> None:
        """To `up`'s process group, as a process manager stops it."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL to `up`'s group; then to whatever found below it outlives it by 10 s.

        Not at once: a launcher killed before it takes its group down would orphan it."""
        if self.process is not None:
            self.signal_group(signal.SIGKILL)
            self.process.wait()
        processes.kill(processes.wait_gone(self.seen, 10))
