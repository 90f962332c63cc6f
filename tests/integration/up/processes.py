"""Processes by PID, read from /proc: what a supervisor started, and what is left of it.

A process is known by its PID and its start time, so a PID the kernel hands
out again later is never mistaken for the one it was. Zombies count as gone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    started: int  # clock ticks after boot
    command: str

    def __str__(self) -> str:
        return f"PID {self.pid} (parent {self.ppid}): {self.command[:160]}"


def read(pid: int) -> tuple[Proc, str] | None:
    """The process and its state letter, or None when there is no such process."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        command = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    return Proc(pid, int(fields[1]), int(fields[19]), command.strip()), fields[0]


def snapshot() -> list[Proc]:
    found = (read(int(p.name)) for p in PROC.iterdir() if p.name.isdigit())
    return [entry[0] for entry in found if entry is not None]


def descendants(root: int) -> list[Proc]:
    """Every live process below `root`, walking parent PIDs."""
    children: dict[int, list[Proc]] = {}
    for proc in snapshot():
        children.setdefault(proc.ppid, []).append(proc)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child.pid)
    return found


def alive(procs: Iterable[Proc]) -> list[Proc]:
    left = []
    for proc in procs:
        now = read(proc.pid)
        if now is not None and now[0].started == proc.started and now[1] != "Z":
            left.append(proc)
    return left


def wait_gone(procs: Iterable[Proc], timeout_s: float) -> list[Proc]:
    """Poll until none of `procs` is alive or `timeout_s` passes; what is still alive."""
    procs = list(procs)
    deadline = time.monotonic() + timeout_s
    while (left := alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill(procs: Iterable[Proc]) -> None:
    """SIGKILL whichever of `procs` is still alive (clean-up after a failed test)."""
    for proc in alive(procs):
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
