"""A backend written at the socket level, for byte timings no ASGI server
gives: each POST gets an SSE response whose chunks go out one `sendall` at a
time, then a pause, then (optionally) the end of the chunked body; or, given `answer`, each POST gets
those bytes as its whole response. GETs (health checks) get 200."""

from __future__ import annotations

import socket
import threading
import time


class RawSseBackend:
    def __init__(self, events: list[bytes], pause_s: float = 0.0, finish: bool = True,
                 answer: bytes | None = None) -> None:
        self.events = events
        self.answer = answer
        self.pause_s = pause_s
        self.finish = finish  # send the chunked terminator after the pause
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def __enter__(self) -> RawSseBackend:
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._respond(conn)
            except OSError:  # the peer left: a server shrugs, as uvicorn does
                pass

    def _respond(self, conn: socket.socket) -> None:
        request = conn.recv(65536)
        if not request:  # connected and left without a word
            return
        if request.startswith(b"GET"):
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
            return
        if self.answer is not None:
            conn.sendall(self.answer)
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in self.events:
            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        time.sleep(self.pause_s)
        if self.finish:
            conn.sendall(b"0\r\n\r\n")
