"""`specgate up`: the embedded default, the whole stack on this machine.

One backend per pool of the policy, of the pool's kind (`specgate.replicas`:
the default's two are speculative on 8001 and standard on 8002), each a real
vLLM CPU server serving the packaged SmolLM2-135M-Instruct, or the project's
own engine with `--engine bundled`; then the gateway on 8080 with the policy
pointed at them. Each
child logs to a file under the cache directory and runs in a process group of
its own under `backends.lifeline`, which ends the group when `up` ends, even
by SIGKILL. Ctrl-C or SIGTERM signals every group at once and waits on one
deadline: each service has its grace (backends 15 s, the gateway its 10 s
drain and 5 s more), then SIGKILL; the bound is printed. A port already in use
stops the start with the PID and command line of the process holding it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from backends import lifeline
from backends.ports import PortHeld, check_free

SERVED_MODEL = "smollm2"
START_TIMEOUT_S = 900.0
BACKEND_GRACE_S = 15.0  # SIGTERM to SIGKILL
GATEWAY_DRAIN_S = 10.0  # the gateway's own drain; its grace is 5 s longer
KILL_WAIT_S = 5.0  # after SIGKILL, for the kernel to take a group down


class StartError(RuntimeError):
    pass


@dataclass
class Service:
    """One child: `argv` run under `backends.lifeline`, in a process group of its own."""

    name: str
    argv: list[str]
    health_url: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    grace_s: float = BACKEND_GRACE_S
    process: subprocess.Popen[bytes] | None = None
    lifeline_fd: int | None = field(default=None, repr=False)  # write end of the pipe the launcher watches

    @property
    def port(self) -> int | None:
        return urlsplit(self.health_url).port

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        read_end, write_end = os.pipe()
        try:
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(
                    lifeline.command(self.argv, read_end), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env={**os.environ, **self.env}, start_new_session=True,
                    pass_fds=(read_end,))
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self.lifeline_fd = write_end

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(self.health_url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def signal(self, signum: int) -> None:
        """Signal the service's process group: the launcher, the command and all it started."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)

    def release(self) -> None:
        if self.lifeline_fd is not None:
            os.close(self.lifeline_fd)
            self.lifeline_fd = None

    def stop(self) -> None:
        stop_all([self], progress=lambda line: None)


def stop_all(services: Sequence[Service], progress: Callable[[str], None] = print) -> None:
    """SIGTERM to every started service at once, SIGKILL to each when its grace is over.

    All graces count from the same instant, so the whole stop takes at most the
    longest grace plus KILL_WAIT_S; a second interrupt kills what is left at once.
    Once a launcher has exited, SIGKILL sweeps whatever its command left in the group.
    """
    pending = [s for s in services if s.process is not None and s.lifeline_fd is not None]
    if not pending:
        return
    bound = max(s.grace_s for s in pending) + KILL_WAIT_S
    progress(f"stopping {len(pending)} services (bound {bound:.0f} s) ...")
    started = time.monotonic()
    exited = {id(s) for s in pending if s.exit_code() is not None}
    for service in pending:
        service.signal(signal.SIGTERM)
    killed: set[int] = set()  # ids of the services sent SIGKILL
    while pending:
        try:
            elapsed = time.monotonic() - started
            for service in list(pending):
                if service.exit_code() is None and elapsed < bound:
                    if elapsed >= service.grace_s and id(service) not in killed:
                        service.signal(signal.SIGKILL)
                        killed.add(id(service))
                    continue
                service.signal(signal.SIGKILL)
                service.release()
                pending.remove(service)
                progress(f"  {service.name}: {_outcome(service, id(service) in exited, id(service) in killed)} "
                         f"after {elapsed:.1f} s")
            if pending:
                time.sleep(0.1)
        except KeyboardInterrupt:
            progress("  interrupted again: SIGKILL to the rest")
            for service in pending:
                service.signal(signal.SIGKILL)
                killed.add(id(service))
    progress(f"stopped in {time.monotonic() - started:.1f} s")


def _outcome(service: Service, exited_before: bool, killed: bool) -> str:
    code = service.exit_code()
    if code is None:
        return "still running at the bound"
    return f"had exited with code {code}" if exited_before else "killed" if killed else "done"


class Stack:
    """Backends first (all at once, they load in parallel), then the gateway."""

    def __init__(self, backends: Sequence[Service], gateway: Service) -> None:
        self.backends = list(backends)
        self.gateway = gateway

    @property
    def services(self) -> list[Service]:
        return [*self.backends, self.gateway]

    def start(self, timeout_s: float = START_TIMEOUT_S, progress: Callable[[str], None] = print) -> None:
        taken: dict[int, str] = {}
        for service in self.services:
            if service.port is not None and taken.setdefault(service.port, service.name) != service.name:
                raise StartError(f"{taken[service.port]} and {service.name} are both given port {service.port}; "
                                 "choose other ports (--port, --backend-ports)")
        for service in self.services:
            if service.port is not None:
                try:
                    check_free("127.0.0.1", service.port)
                except PortHeld as exc:
                    pids = " ".join(str(pid) for pid, _ in exc.holders)
                    advice = f"stop it (kill {pids})" if pids else "stop it"
                    raise StartError(f"{service.name}: {exc}; {advice} or choose other ports "
                                     "(--port, --backend-ports)") from None
        for service in self.backends:
            service.start()
        wait_healthy(self.backends, timeout_s, progress)
        self.gateway.start()
        wait_healthy([self.gateway], 60.0, progress)

    def wait(self) -> Service:
        """Block until a child exits; returns it."""
        while True:
            for service in self.services:
                if service.exit_code() is not None:
                    return service
            time.sleep(0.5)

    def stop(self, progress: Callable[[str], None] = print) -> None:
        stop_all(self.services, progress)


def wait_healthy(services: Sequence[Service], timeout_s: float, progress: Callable[[str], None]) -> None:
    started = time.monotonic()
    pending = list(services)
    last_report = 0.0
    while pending:
        for service in list(pending):
            code = service.exit_code()
            if code is not None:
                raise StartError(f"{service.name} exited with code {code} while starting; its log: {service.log}")
            if service.healthy():
                pending.remove(service)
                progress(f"  {service.name} ready after {time.monotonic() - started:.0f} s")
        elapsed = time.monotonic() - started
        if pending and elapsed > timeout_s:
            names = ", ".join(f"{s.name} (log: {s.log})" for s in pending)
            raise StartError(f"not ready after {timeout_s:.0f} s: {names}")
        if pending and elapsed - last_report >= 10:
            last_report = elapsed
            progress(f"  loading: {', '.join(s.name for s in pending)} ({elapsed:.0f} s)")
        if pending:
            time.sleep(0.5)


def gateway_service(policy: Path, port: int, logs: Path, python: str = sys.executable) -> Service:
    argv = [python, "-m", "specgate.cli", "serve", "--policy", str(policy), "--host", "127.0.0.1",
            "--port", str(port)]
    drain_s = float(os.environ.get("SPECGATE_DRAIN_TIMEOUT_S", GATEWAY_DRAIN_S))
    return Service(f"gateway (:{port})", argv, f"http://127.0.0.1:{port}/readyz", logs / "gateway.log",
                   {"SPECGATE_DRAIN_TIMEOUT_S": f"{drain_s:g}"}, grace_s=drain_s + 5)


def banner(port: int) -> str:
    base = f"http://127.0.0.1:{port}/v1"
    haiku = {"role": "user", "content": "Write a haiku"}
    body = json.dumps({"model": SERVED_MODEL, "messages": [haiku], "max_tokens": 128, "temperature": 0})
    return f"""
specgate is up: {base}

  curl {base}/chat/completions -H 'content-type: application/json' \\
    -d '{body}' -i

  from openai import OpenAI
  client = OpenAI(base_url="{base}", api_key="unused")
  reply = client.chat.completions.with_raw_response.create(model="{SERVED_MODEL}", max_tokens=128, temperature=0,
      messages=[{{"role": "user", "content": "Write a haiku"}}])
  print(reply.headers["x-specgate-pool"], reply.parse().choices[0].message.content)

Ctrl-C stops everything.
"""
