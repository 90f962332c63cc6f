"""`specgate serve --workers N` as a child process, and what /proc says about its workers."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.fakes.process import free_port, spawn_module

TCP_LISTEN = "0A"


def child_pids(pid: int) -> set[int]:
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.add(int(entry))
    return children


def listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listens(pid: int, inodes: set[str]) -> bool:
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return any(link.startswith("socket:[") and link[8:-1] in inodes for link in links)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class ServeWorkers:
    """`specgate serve --workers N` on a free port, stdout and stderr in `log`."""

    def __init__(self, policy: Path, log: Path, workers: int, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.process = spawn_module("specgate.cli", "serve", "--policy", str(policy), "--host", "127.0.0.1",
                                        "--port", str(self.port), "--workers", str(workers),
                                        env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait_listening(self, count: int, timeout: float = 60.0) -> set[int]:
        """The worker pids, once `count` of them listen on the port (a worker listens once started)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            inodes = listening_inodes(self.port)
            workers = {pid for pid in child_pids(self.process.pid) if listens(pid, inodes)}
            if len(workers) == count:
                return workers
            time.sleep(0.1)
        raise AssertionError(f"{count} workers did not listen within {timeout} s: {self.log.read_text()}")

    def wait_exit(self, timeout: float = 60.0) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
