"""The CPU time a process tree has spent, from /proc (Linux): what the overhead
benchmark divides by the requests a target served."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_tree(root: int) -> list[int]:
    """`root` and every process under it (a gateway's workers, nginx's worker), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone while we looked
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += parents.get(pid, [])
    return tree


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time these processes have spent so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / CLOCK_TICKS
