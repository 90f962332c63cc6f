"""`specgate serve`'s protocol writes what uvicorn's own httptools protocol writes.

The per-request part of uvicorn's protocol and its `RequestResponseCycle` are
written out in gateway/edge (http_protocol.py, response_cycle.py) so that
they can be compiled. Each exchange here goes to a server with uvicorn's
protocol and to one with the gateway's, on 127.0.0.1, and the bytes that come
back until the server closes the connection must be the same (but for the
Date header's second)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from backends.serving.server import BackgroundServer
from gateway.settings import Settings
from specgate.workers import uvicorn_options

READ_DEADLINE_S = 10.0


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An answer of each shape, by path."""
    if scope["type"] != "http":
        return
    path, body, more = scope["path"], b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    if path == "/nothing":  # returns without an answer: a 500
        return
    if path.startswith("/bad-"):  # a value that would split the response, or a name with a space: closed
        bad = {"/bad-header": (b"x-bad", b"a\r\nb"), "/bad-name": (b"x bad", b"v")}[path]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-good", b"v"), bad]})
        return
    if path == "/chunked":  # no length: chunked, written in three messages
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"one ", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await send({"type": "http.response.body", "body": b"two", "more_body": False})
        return
    if path == "/half":  # started, never finished: the connection is closed
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"12345", "more_body": True})
        return
    if path == "/no-content":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    headers = [(b"Content-Length", str(len(body) or 5).encode()), (b"X-Path", path.encode())]
    if path == "/close":
        headers.append((b"Connection", b"Close"))
    await send({"type": "http.response.start", "status": 201 if body else 200, "headers": headers})
    await send({"type": "http.response.body", "body": body or b"hello"})


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[BackgroundServer, BackgroundServer]]:
    served = uvicorn_options(Settings())  # as `specgate serve` serves: its protocol, keep-alive (a float), ...
    options = {k: v for k, v in served.items() if k not in ("host", "port", "log_level", "lifespan", "http")}
    theirs = BackgroundServer(app, http="httptools", options=options).start()
    ours = BackgroundServer(app, http=served["http"], options=options).start()
    yield theirs, ours
    theirs.stop(graceful=True)
    ours.stop(graceful=True)


def exchange(server: BackgroundServer, *parts: bytes) -> bytes:
    """Send `parts` in turn, each after the answer to the one before has begun (the first at once);
    everything the server writes until it closes, with the Date header's value blanked."""
    with socket.create_connection((server.host, server.port), timeout=READ_DEADLINE_S) as sock:
        received = b""
        for i, part in enumerate(parts):
            if i:
                while b"\r\n\r\n" not in received:  # the last part's answer (or 100 Continue) has begun
                    data = sock.recv(65536)
                    assert data, received
                    received += data
            sock.sendall(part)
        while data := sock.recv(65536):
            received += data
    return re.sub(rb"(?i)\r\ndate: [^\r]*", b"\r\ndate: -", received)


def same(servers: tuple[BackgroundServer, BackgroundServer], *parts: bytes) -> bytes:
    theirs, ours = (exchange(server, *parts) for server in servers)
    assert ours == theirs
    return ours


def request(method: str, path: str, body: bytes = b"", version: str = "1.1", *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "host: test", *headers]
    if body:
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_pipelined_requests_are_answered_in_turn_alike(servers) -> None:
    wire = same(servers, request("GET", "/length") + request("GET", "/chunked") + request("POST", "/echo", b"abc")
                + request("HEAD", "/length") + request("GET", "/no-content") + request("GET", "/close"))
    assert wire.count(b"HTTP/1.1 ") == 6
    assert b"transfer-encoding: chunked\r\n\r\n4\r\none \r\n3\r\ntwo\r\n0\r\n\r\n" in wire
    assert b"HTTP/1.1 201 Created" in wire and wire.endswith(b"connection: Close\r\n\r\nhello")


def test_a_body_asked_for_with_100_continue_alike(servers) -> None:
    head = request("POST", "/echo", b"", "1.1", "expect: 100-continue", "content-length: 4", "connection: close")
    wire = same(servers, head, b"abcd")
    assert wire.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n") and wire.endswith(b"abcd")


def test_http_1_0_and_keep_alive_ends_alike(servers) -> None:
    wire = same(servers, request("GET", "/length", b"", "1.0"))
    assert b"connection: close\r\n" in wire


def test_an_app_that_answers_nothing_gets_a_500_alike(servers) -> None:
    assert same(servers, request("GET", "/nothing")).startswith(b"HTTP/1.1 500 Internal Server Error\r\n")


def test_an_answer_left_unfinished_or_a_header_that_splits_it_closes_alike(servers) -> None:
    assert same(servers, request("GET", "/half")).endswith(b"12345")
    assert same(servers, request("GET", "/bad-header")) == b""
    assert same(servers, request("GET", "/bad-name")) == b""


def test_a_quoted_path_and_its_query_reach_the_app_alike(servers) -> None:
    wire = same(servers, request("GET", "/a%20b?x=1", b"", "1.1", "connection: close"))
    assert b"x-path: /a b\r\n" in wire


def test_an_upgrade_is_answered_alike(servers) -> None:
    """A protocol no server here speaks (h2c) is served as a plain request; a WebSocket handshake
    goes to uvicorn's own WebSocket protocol where one is installed, or is served plain, as uvicorn
    serves it (the app accepts no WebSocket: either way an answer, then the close)."""
    h2c = request("GET", "/length", b"", "1.1", "connection: upgrade, http2-settings, close", "upgrade: h2c",
                  "http2-settings: AAMAAABkAAQAAP__")
    assert same(servers, h2c).startswith(b"HTTP/1.1 200 OK\r\n")
    handshake = request("GET", "/length", b"", "1.1", "connection: upgrade", "upgrade: websocket",
                        "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==", "sec-websocket-version: 13")
    assert same(servers, handshake).startswith(b"HTTP/1.1 ")
