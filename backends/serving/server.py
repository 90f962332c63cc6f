"""Run an ASGI app with uvicorn: in the foreground, or in a background thread.

`BackgroundServer` is what tests and embedded setups use: it binds the port
itself (0 picks a free one), starts uvicorn in a thread and returns once the
server accepts connections. `stop()` behaves like a backend going away: open
connections are aborted, then the server exits; `start()` again reopens the
same port.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import uvicorn


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()  # a port in use leaves no socket behind
        raise
    sock.set_inheritable(True)
    return sock


def uvicorn_config(
    app: Any, host: str, port: int, log_level: str = "warning", lifespan: str = "off", http: Any = "auto",
    **options: Any,
) -> uvicorn.Config:
    return uvicorn.Config(app, **{"host": host, "port": port, "log_level": log_level, "lifespan": lifespan,
                                  "timeout_graceful_shutdown": 2, "http": http, **options})


class BackgroundServer:
    """`app` served on `host:port` from a daemon thread.

    Usable as a context manager; `url` is `http://host:port`. `lifespan="on"`
    runs the app's startup and shutdown handlers; `http` is uvicorn's HTTP
    protocol (a name or a protocol class); `options`, more of uvicorn's settings.
    """

    def __init__(
        self, app: Any, *, host: str = "127.0.0.1", port: int = 0, lifespan: str = "off",
        http: Any = "auto", options: dict[str, Any] | None = None,
    ) -> None:
        self.app = app
        self.options = options or {}
        self.lifespan = lifespan
        self.http = http
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> BackgroundServer:
        if self.running:
            return self
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn_config(self.app, self.host, self.port, lifespan=self.lifespan, http=self.http, **self.options)
        server = uvicorn.Server(config)
        ready = threading.Event()

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            ready_task = asyncio.ensure_future(_signal_when_started(server, ready))
            try:
                await server.serve(sockets=[sock])
            finally:
                ready_task.cancel()
                # A forced exit leaves connections that were mid-request (or came in
                # after `stop` aborted the others) open: close them before the loop goes.
                _abort_connections(server)
                await asyncio.sleep(0)
                ready.set()

        def main() -> None:
            try:
                asyncio.run(serve())
            finally:
                sock.close()

        self._server = server
        self._thread = threading.Thread(target=main, name=f"uvicorn:{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or not server.started:
            self.stop()
            raise RuntimeError(f"server on {self.url} did not start")
        return self

    def stop(self, timeout: float = 10.0, graceful: bool = False) -> None:
        """Abort open connections and shut the server down (`graceful`: let
        requests finish and run the app's shutdown, as on SIGTERM)."""
        server, thread, loop = self._server, self._thread, self._loop
        if server is None or thread is None:
            return
        if graceful:
            server.should_exit = True
            thread.join(timeout)
            self._server = self._thread = self._loop = None
            return
        if loop is not None and thread.is_alive():
            try:
                loop.call_soon_threadsafe(_abort_connections, server)
            except RuntimeError:  # the loop already closed
                pass
        server.force_exit = True
        server.should_exit = True
        thread.join(timeout)
        self._server = self._thread = self._loop = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


async def _signal_when_started(server: uvicorn.Server, ready: threading.Event) -> None:
    while not server.started:
        await asyncio.sleep(0.005)
    ready.set()


def _abort_connections(server: uvicorn.Server) -> None:
    for connection in list(server.server_state.connections):
        transport = getattr(connection, "transport", None)
        if transport is not None:
            transport.abort()
