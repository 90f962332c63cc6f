"""How `specgate serve` runs the gateway: uvicorn's options, and `--workers N`,
N gateway processes on one port.

Each worker is a whole gateway (`specgate serve --worker-of FD`) that binds the
port itself with SO_REUSEPORT, so the kernel spreads new connections over the
workers' listening sockets. The workers share what a gateway decides with
(overrides, the guard's verdicts, the load) only through SPECGATE_STATE_URL,
which is why more than one worker needs it.

The parent holds the port while it runs (bound, never listening: a port in use
fails at once, and port 0 is resolved once for all workers), forwards SIGTERM
or SIGINT to every worker, which drains as a single gateway does, and stops
the others and exits 1 when one dies. Workers run in a session of their own,
so a terminal's Ctrl-C reaches them once, through the parent; each holds the
read end of a pipe from the parent and stops itself when the parent is gone.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

POLL_S = 0.2
KILL_AFTER_DRAIN_S = 10.0
# uvicorn re-raises the signal that stopped it once drained: a worker ends by it, or with 0
CLEAN_EXITS = (0, -signal.SIGTERM, -signal.SIGINT)


def uvicorn_options(settings: Any) -> dict[str, Any]:
    """How uvicorn serves the gateway, one process or each worker of many."""
    from gateway.edge.http_protocol import with_header_timeout
    # uvicorn types the drain as int but waits with asyncio: a float is kept exact (int() made 0.8 s none).
    # proxy_headers off: the gateway reads no client address, and uvicorn's X-Forwarded-For middleware
    # was an interpreted frame around every request.
    return {"host": settings.host, "port": settings.port, "log_level": "warning", "access_log": False,
            "proxy_headers": False, "timeout_graceful_shutdown": settings.drain_timeout_s,
            "timeout_keep_alive": settings.keep_alive_s,
            "http": with_header_timeout(settings.header_timeout_s, settings.max_header_bytes, settings.max_headers),
            "lifespan": "on"}


def supervise(args: argparse.Namespace, settings: Any) -> int:
    if args.workers < 1:
        raise ValueError(f"--workers must be 1 or more, not {args.workers}")
    if not settings.state_url:
        raise ValueError(f"--workers {args.workers} needs SPECGATE_STATE_URL (redis://, rediss:// or "
                         "unix://): without a shared store each worker keeps its own overrides, guard "
                         "and load")
    from gateway.policy.loader import PolicyError, load_policy
    try:  # once here rather than once per worker
        load_policy(settings.policy)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    with shared_socket(settings.host, settings.port) as reserved:
        port = reserved.getsockname()[1]
        command = [sys.executable, "-m", "specgate.cli", "serve", "--host", settings.host,
                   "--port", str(port), "--policy", str(settings.policy)]
        if args.log_level:
            command += ["--log-level", args.log_level]
        command += ["--compiled", args.compiled, *(["--compiled-dir", str(args.compiled_dir)] if args.compiled_dir
                                                   else [])]
        return Workers(command, args.workers, settings.drain_timeout_s).run()


def shared_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that other processes of this user may bind too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class Workers:
    """`count` copies of `command`, started together and stopped together."""

    def __init__(self, command: list[str], count: int, drain_s: float) -> None:
        self.command = command
        self.count = count
        self.drain_s = drain_s
        self.processes: list[subprocess.Popen[bytes]] = []

    def run(self) -> int:
        stop = threading.Event()
        handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        read_end, write_end = os.pipe()
        try:
            for _ in range(self.count):
                self.processes.append(subprocess.Popen(
                    [*self.command, "--worker-of", str(read_end)], pass_fds=(read_end,),
                    start_new_session=True))
            os.close(read_end)
            dead = self._watch(stop)
        finally:
            self._stop()
            os.close(write_end)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        if dead is not None:
            print(f"specgate serve: worker {dead.pid} exited with {dead.returncode}; "
                  f"stopped the other {self.count - 1}", file=sys.stderr)
            return 1
        return 0 if all(p.returncode in CLEAN_EXITS for p in self.processes) else 1

    def _watch(self, stop: threading.Event) -> subprocess.Popen[bytes] | None:
        """Wait for a stop signal (None) or a worker's exit (that worker)."""
        while not stop.wait(POLL_S):
            for process in self.processes:
                if process.poll() is not None:
                    return process
        return None

    def _stop(self) -> None:
        """SIGTERM to every live worker; SIGKILL to any still there after its drain."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.drain_s + KILL_AFTER_DRAIN_S
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def serve_worker(app: Any, settings: Any, parent_fd: int) -> int:
    """Serve `app` on the shared port until SIGTERM, SIGINT or the parent's exit."""
    import uvicorn

    from specgate.server import GatewayServer
    threading.Thread(target=_stop_with_parent, args=(parent_fd,), daemon=True).start()
    server = GatewayServer(uvicorn.Config(app, **uvicorn_options(settings)))
    with shared_socket(settings.host, settings.port) as sock:
        server.run(sockets=[sock])
    return 0 if server.started else 3


def _stop_with_parent(parent_fd: int) -> None:
    while os.read(parent_fd, 1):
        pass
    os.kill(os.getpid(), signal.SIGTERM)
