"""A client for testing the HTTP surface itself: one socket, any bytes out,
answers read back framed as RFC 9112 frames them (1xx skipped, no body after
HEAD or on 204/304, chunked or Content-Length or until close)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gateway.upstream.runtime import Runtime


class Hang(AssertionError):
    """Nothing arrived within the read deadline: the gateway hangs."""


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]  # names lower-case, in order
    body: bytes

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]

    def header(self, name: str) -> str | None:
        found = self.values(name)
        return found[0] if found else None

    def json(self) -> Any:
        return json.loads(self.body)


class RawConnection:
    def __init__(self, url: str, read_deadline_s: float) -> None:
        parts = urlsplit(url)
        self.deadline_s = read_deadline_s
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=read_deadline_s)
        self.buffer = b""
        self.eof = False
        self.closing = False  # the last answer said "connection: close": nothing follows it

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):  # refused before it was all read: read why
            pass

    def answer(self, method: str = "GET") -> Answer | None:
        """The next final answer, or None when the server closed the connection first."""
        if self.closing:
            return None
        while True:
            head = self._read_until(b"\r\n\r\n")
            if head is None:
                return None
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])]
            if 100 <= status < 200:
                continue
            answer = Answer(status, headers, self._body(method, status, headers))
            self.closing = "close" in (answer.header("connection") or "").lower()
            return answer

    def _body(self, method: str, status: int, headers: list[tuple[str, str]]) -> bytes:
        fields = dict(headers)
        if method == "HEAD" or status in (204, 304):
            return b""
        if "chunked" in fields.get("transfer-encoding", "").lower():
            body = b""
            while (size_line := self._read_until(b"\r\n")) is not None:
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    while self._read_until(b"\r\n") not in (b"", None):  # trailers
                        pass
                    return body
                body += self._read_exactly(size + 2)[:-2]
            raise AssertionError("the connection closed inside a chunked body")
        if "content-length" in fields:
            return self._read_exactly(int(fields["content-length"]))
        while not self.eof:
            self._fill()
        body, self.buffer = self.buffer, b""
        return body

    def _read_until(self, marker: bytes) -> bytes | None:
        while (end := self.buffer.find(marker)) < 0:
            if self.eof:
                if self.buffer:
                    raise AssertionError(f"the connection closed in the middle of {self.buffer[:200]!r}")
                return None
            self._fill()
        found, self.buffer = self.buffer[:end], self.buffer[end + len(marker):]
        return found

    def _read_exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if self.eof:
                raise AssertionError(f"the connection closed {size - len(self.buffer)} bytes short of a body")
            self._fill()
        found, self.buffer = self.buffer[:size], self.buffer[size:]
        return found

    def _fill(self) -> None:
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise Hang(f"no byte from the gateway within {self.deadline_s:g} s") from None
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
        self.buffer += data


def exchange(url: str, request: bytes, method: str = "GET", deadline_s: float = 30.0) -> Answer | None:
    with RawConnection(url, deadline_s) as connection:
        connection.send(request)
        return connection.answer(method)


def leases_outstanding(runtime: Runtime) -> dict[str, int]:
    """What the pools count as in flight, by pool and endpoint; empty when all is back to zero."""
    counts = {}
    for pool in runtime.pools.values():
        if pool.in_flight:
            counts[pool.name] = pool.in_flight
        for endpoint in pool.endpoints:
            if endpoint.outstanding:
                counts[endpoint.url] = endpoint.outstanding
    return counts


def wait_for(predicate: Callable[[], bool], deadline_s: float) -> bool:
    """Poll until `predicate()` holds; False if it still does not after `deadline_s`
    (an event bound for a state change, not a timing assertion)."""
    give_up = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.005)
    return True
