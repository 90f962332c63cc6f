"""Loopback servers that answer the guard badly on purpose: a Prometheus HTTP
API whose vectors the test sets (NaN, infinities, nothing), and a /metrics
endpoint that trickles its answer one byte at a time."""

from __future__ import annotations

import json
import socketserver
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

Vector = list[tuple[dict[str, str], str]]  # (labels, value as Prometheus writes it: "1.5", "NaN", "+Inf")


class _InThread:
    """Serves `self.server` from a daemon thread while in a `with` block."""

    server: socketserver.BaseServer

    def __enter__(self) -> Self:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietHTTPServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up on an answer early is no error here


class FakePrometheus(_InThread):
    """`GET /api/v1/query`: the vector of the first `answers` key the query
    contains (a metric name, say), else an empty vector; or `body` verbatim."""

    def __init__(self) -> None:
        self.answers: dict[str, Vector] = {}
        self.body: bytes | None = None
        self.times: list[str | None] = []  # each query's evaluation time, as sent
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                params = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                query = params.get("query", [""])[0]
                fake.times.append(params.get("time", [None])[0])
                vector = next((v for key, v in list(fake.answers.items()) if key in query), [])
                body = fake.body or json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
                    {"metric": labels, "value": [1700000000.0, value]} for labels, value in vector]}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = _QuietHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


class TricklingMetrics(_InThread):
    """`GET /metrics` answers a complete header, then a valid exposition one byte
    every `gap_s`. `hung_up` is set when a client closes the connection before
    the body is complete; `finished` when a whole body went out."""

    BODY = b"".join(b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running %d\n" % i
                    for i in range(40))

    def __init__(self, gap_s: float = 0.02) -> None:
        self.hung_up = threading.Event()
        self.finished = threading.Event()
        stop = threading.Event()
        self._stop = stop
        fake = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.recv(65536)
                try:
                    self.request.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n"
                                         b"content-length: %d\r\n\r\n" % len(fake.BODY))
                    for i in range(len(fake.BODY)):
                        if stop.wait(gap_s):
                            return
                        self.request.sendall(fake.BODY[i:i + 1])
                except OSError:  # the client closed the connection: it gave up on the body
                    fake.hung_up.set()
                    return
                fake.finished.set()

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        super().__exit__(*exc)
