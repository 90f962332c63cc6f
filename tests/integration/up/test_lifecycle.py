"""Nothing `specgate up` starts outlives it.

`up` runs as a process manager runs it: leading a process group of its own,
stopped with SIGTERM to that group and, when its grace runs out, SIGKILL. The
backends are fake vLLM servers (`up --backend-command`, the same start, watch
and stop code as vLLM's) that fork a helper first, as vLLM's API server forks
its engine core; the helper ignores SIGTERM. Every process `up` started is
collected by PID from /proc while the stack runs, and must be gone (or a
zombie) within 20 s of the kill.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backends.ports import holders
from tests.fakes.process import free_port
from tests.integration.up import processes
from tests.integration.up.up_process import FAKE_BACKEND, UpProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # specgate up and its backends as processes

GONE_WITHIN_S = 20.0
# at least the two backends, their helpers and the gateway
STACK_PROCESSES = 2 + 2 + 1


@pytest.fixture
def started() -> Iterator[list[UpProcess]]:
    """`up` processes a test starts; whatever is left of them is killed by PID afterwards."""
    ups: list[UpProcess] = []
    yield ups
    for up in ups:
        up.kill()


def start_up(ups: list[UpProcess], work: Path, *backend_args: str, **kwargs) -> UpProcess:
    work.mkdir(exist_ok=True)
    command = " ".join([FAKE_BACKEND, *backend_args])
    up = UpProcess(work, "--cache-dir", str(work / "cache"), "--backend-command", command, **kwargs)
    ups.append(up)
    return up.start()


def running_stack(up: UpProcess) -> list[processes.Proc]:
    up.wait_ready(60)
    procs = up.descendants()
    assert len(procs) >= STACK_PROCESSES, "\n".join(map(str, procs))
    return procs


def assert_all_gone(procs: list[processes.Proc], what: str) -> None:
    left = processes.wait_gone(procs, GONE_WITHIN_S)
    assert not left, (f"{len(left)} of the {len(procs)} processes `specgate up` started are alive "
                      f"{GONE_WITHIN_S:.0f} s after {what}:\n" + "\n".join(map(str, left)))


def hold_a_stream(url: str) -> threading.Event:
    """A streamed completion through the gateway, in flight once the event is set."""
    first_chunk = threading.Event()

    def stream() -> None:
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
                "temperature": 0, "stream": True}
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
                for _ in response.iter_bytes():
                    first_chunk.set()
        except httpx.HTTPError:
            pass  # the stack goes down under it

    threading.Thread(target=stream, daemon=True).start()
    return first_chunk


def test_sigterm_during_a_drain_then_sigkill_leaves_nothing_behind(started, tmp_path):
    up = start_up(started, tmp_path / "up", "--chunks", "60", "--delay", "0.5")  # a 30 s stream
    procs = running_stack(up)
    assert hold_a_stream(up.url).wait(30), "the stream through the gateway never started"
    up.signal_group(signal.SIGTERM)
    time.sleep(2)
    up.signal_group(signal.SIGKILL)
    assert_all_gone(procs, "SIGTERM and SIGKILL 2 s later")


def test_sigkill_alone_leaves_nothing_behind(started, tmp_path):
    up = start_up(started, tmp_path / "up")
    procs = running_stack(up)
    up.signal_group(signal.SIGKILL)
    assert_all_gone(procs, "SIGKILL")


def test_sigterm_stops_everything_within_the_printed_bound(started, tmp_path):
    up = start_up(started, tmp_path / "up")
    procs = running_stack(up)
    up.signal_group(signal.SIGTERM)
    assert up.process is not None and up.process.wait(60) == 0, up.output()
    assert_all_gone(procs, "SIGTERM")
    out = up.stdout.read_text()
    assert re.search(r"stopping 3 services \(bound \d+ s\)", out), out
    assert len(re.findall(r": (done|killed) after [\d.]+ s", out)) == 3, out


def test_a_second_up_after_a_crash_starts_or_names_the_blocker(started, tmp_path):
    first = start_up(started, tmp_path / "first")
    procs = running_stack(first)
    first.signal_group(signal.SIGKILL)
    second = start_up(started, tmp_path / "second", backend_ports=first.backend_ports, port=first.port)
    code = second.ready_or_exited(60)
    print("the second up", "started" if code is None else f"exited with {code}: {second.stderr.read_text()}")
    if code is not None:  # a leftover of the first was still there: named, not a traceback
        errors = second.stderr.read_text()
        assert code != 0
        held = re.search(r"port (\d+) is already in use by PID (\d+)", errors)
        assert held, second.output()
        assert int(held[1]) in (first.port, *first.backend_ports)
        assert int(held[2]) in {p.pid for p in procs}, f"{errors}\nnot one of:\n" + "\n".join(map(str, procs))
        assert "Traceback" not in errors
        assert_all_gone(procs, "SIGKILL")
        second = start_up(started, tmp_path / "third", backend_ports=first.backend_ports, port=first.port)
        second.wait_ready(60)
    # the stack that answers is the new one, not what is left of the first
    assert_all_gone(procs, "SIGKILL")
    mine = {proc.pid for proc in second.descendants()}
    for port in (first.port, *first.backend_ports):
        owners = {pid for pid, _ in holders(port)}
        assert owners and owners <= mine, f"port {port} is held by {owners}, not by the new stack's {mine}"


def test_a_port_held_by_another_process_is_named(started, tmp_path):
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        up = start_up(started, tmp_path / "up", backend_ports=(free_port(), port))
        assert up.process is not None
        code = up.process.wait(60)
    errors = up.stderr.read_text()
    assert code == 1, up.output()
    assert f"port {port} is already in use by PID {os.getpid()}: " in errors, errors
    assert "Traceback" not in errors
    assert not (tmp_path / "up" / "cache" / "logs").exists(), "a backend was started on a held port"
