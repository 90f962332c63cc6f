"""Start a command that dies with its supervisor, even when the supervisor is SIGKILLed.

    python -m backends.lifeline --fd FD [--grace S] -- COMMAND [ARG...]

The supervisor (`specgate up`) makes a pipe per child, keeps the write end and
never writes to it; the launcher inherits the read end as FD. Whenever the
supervisor's process ends, SIGKILL and the OOM killer included, the kernel
closes the write end and the launcher reads end-of-file. It then sends SIGTERM
to its process group, waits up to S seconds (default 5) for COMMAND, and
SIGKILLs the group, itself included.

The launcher leads its own process group and runs COMMAND in it, so whatever
COMMAND forks or spawns stays in the group and goes with it: vLLM's API server
forks its engine-core process (multiprocessing, "fork" on CPU) and nothing in
that process watches its parent; only vLLM's data-parallel supervisor, which
`specgate up` does not use, moves to a group of its own.

Why a pipe and not PR_SET_PDEATHSIG: that is Linux only (macOS and the BSDs
have nothing like it), it fires when the *thread* that forked the child ends
rather than the process, and the kernel clears it on fork, so it never reaches
vLLM's engine core. A pipe's end-of-file means the same on Linux, macOS and the
BSDs. Windows has no process groups; `specgate up` does not run there.

Otherwise the launcher stays out of the way. COMMAND inherits its stdio and
environment. SIGTERM, SIGINT and SIGHUP sent to the launcher are not acted on:
stop COMMAND by signalling the process group, as `specgate up` does. When
COMMAND exits, the launcher sends SIGTERM to the rest of the group and exits
with COMMAND's status (128 + N after signal N).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
from collections.abc import Sequence

ORPHAN_GRACE_S = 5.0
POLL_S = 0.1


def command(argv: Sequence[str], fd: int, grace_s: float = ORPHAN_GRACE_S,
            python: str = sys.executable) -> list[str]:
    """The argv that runs `argv` under the launcher, watching pipe end `fd`."""
    return [python, "-m", "backends.lifeline", "--fd", str(fd), "--grace", f"{grace_s:g}", "--", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.lifeline", description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="read end of the supervisor's pipe")
    parser.add_argument("--grace", type=float, default=ORPHAN_GRACE_S,
                        help="seconds between SIGTERM and SIGKILL once the supervisor is gone")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    argv_ = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv_:
        parser.error("no command given")
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)  # a handler, not SIG_IGN, which COMMAND would inherit
    try:
        child = subprocess.Popen(argv_)
    except OSError as exc:
        print(f"lifeline: cannot start {argv_[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    supervisor_gone = False
    while child.poll() is None and not supervisor_gone:
        readable, _, _ = select.select([args.fd], [], [], POLL_S)
        supervisor_gone = bool(readable) and not os.read(args.fd, 1)
    os.killpg(0, signal.SIGTERM)
    if not supervisor_gone:
        code = child.returncode
        return 128 - code if code < 0 else code
    try:
        child.wait(args.grace)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(0, signal.SIGKILL)
    return 137  # not reached: SIGKILL ends this process too


def _ignore(signum: int, frame: object) -> None:
    pass


if __name__ == "__main__":
    sys.exit(main())
