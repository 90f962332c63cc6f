"""backends.lifeline on its own: it passes its command's exit status through,
and once the pipe's write end closes (the supervisor gone) it takes its whole
process group down, a member that ignores SIGTERM included."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from backends import lifeline
from tests.fakes.process import REPO_ROOT
from tests.integration.up import processes

pytestmark = pytest.mark.slow  # process groups

IGNORES_SIGTERM = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.fork(); "
                   "time.sleep(600)")


def launch(*argv: str, grace_s: float = 1.0) -> tuple[subprocess.Popen[bytes], int]:
    """The launcher running `argv`, and the write end of its pipe."""
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(lifeline.command(argv, read_end, grace_s), pass_fds=(read_end,),
                                   cwd=REPO_ROOT, start_new_session=True)
    finally:
        os.close(read_end)
    return process, write_end


def test_the_command_exit_status_passes_through():
    process, write_end = launch(sys.executable, "-c", "raise SystemExit(3)")
    try:
        assert process.wait(60) == 3
    finally:
        os.close(write_end)


def test_a_command_killed_by_a_signal_exits_128_plus_its_number():
    process, write_end = launch(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    try:
        assert process.wait(60) == 128 + 9
    finally:
        os.close(write_end)


def test_the_group_goes_when_the_pipe_closes():
    process, write_end = launch(sys.executable, "-c", IGNORES_SIGTERM)
    group: list[processes.Proc] = []
    try:
        deadline = time.monotonic() + 30
        while len(below := processes.descendants(process.pid)) < 2:  # the command and its fork
            assert process.poll() is None and time.monotonic() < deadline, below
            time.sleep(0.05)
        launcher = processes.read(process.pid)
        assert launcher is not None
        group = [launcher[0], *below]
        os.close(write_end)
        left = processes.wait_gone(group, 20)
        assert not left, "alive 20 s after the pipe closed:\n" + "\n".join(map(str, left))
    finally:
        processes.kill(group)
        process.wait()
