"""Who holds a TCP port, so that a busy port is a clear start-up error.

`check_free(host, port)` binds the port for a moment (SO_REUSEADDR, as servers
do, so connections in TIME_WAIT do not count) and, when something listens
there, raises `PortHeld` naming it: on Linux the listening socket's inode is
looked up in /proc/net/tcp and tcp6, and the process holding it in
/proc/PID/fd (processes of other users stay anonymous unless run as root).
Elsewhere the error names the port only.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

PROC = Path("/proc")
TCP_LISTEN = "0A"
MAX_COMMAND_CHARS = 300


class PortHeld(RuntimeError):
    def __init__(self, port: int, holders: list[tuple[int, str]]) -> None:
        self.port = port
        self.holders = holders
        who = "; ".join(f"PID {pid}: {command}" for pid, command in holders) or "another process"
        super().__init__(f"port {port} is already in use by {who}")


def check_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise PortHeld(port, holders(port)) from None


def holders(port: int, proc: Path = PROC) -> list[tuple[int, str]]:
    """(PID, command line) of every process with a socket listening on `port`."""
    inodes = listening_inodes(port, proc)
    found = []
    for pid_dir in _pid_dirs(proc):
        try:
            links = {os.readlink(fd) for fd in (pid_dir / "fd").iterdir()}
            if any(f"socket:[{inode}]" in links for inode in inodes):
                found.append((int(pid_dir.name), command_line(pid_dir)))
        except OSError:  # gone meanwhile, or not ours to look into
            continue
    return found


def listening_inodes(port: int, proc: Path = PROC) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port and inode != "0":
                inodes.add(inode)
    return inodes


def command_line(pid_dir: Path) -> str:
    args = (pid_dir / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    text = " ".join(" ".join(a.decode(errors="replace").split()) for a in args)  # one line
    text = text or f"[{(pid_dir / 'comm').read_text().strip()}]"  # a kernel thread
    return text if len(text) <= MAX_COMMAND_CHARS else text[: MAX_COMMAND_CHARS - 3] + "..."


def _pid_dirs(proc: Path) -> list[Path]:
    try:
        return [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return []
