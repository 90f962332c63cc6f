"""Header limits are enforced while the head is parsed: a huge header value
is answered 431 before the client has finished sending it (nothing waits for
the end of the value, nothing buffers it), too many header lines likewise,
and everyone else is served meanwhile. The gateway served by uvicorn with
its own HTTP protocol, as `specgate serve` runs it, on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator

import httpx
import pytest
import yaml

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.edge.http_protocol import with_header_timeout
from gateway.settings import Settings

from .conftest import policy_dict
from .raw_http import RawConnection
from .test_request_path import GREEDY

MAX_HEADER_BYTES = 32 * 1024
MAX_HEADERS = 50


@pytest.fixture
def served(tmp_path, spec_fake, std_fake) -> Iterator[BackgroundServer]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy_dict([spec_fake.url], [std_fake.url])))
    settings = Settings(policy=path, max_header_bytes=MAX_HEADER_BYTES, max_headers=MAX_HEADERS)
    protocol = with_header_timeout(60.0, settings.max_header_bytes, settings.max_headers)
    server = BackgroundServer(create_app(settings), lifespan="on", http=protocol).start()
    yield server
    server.stop(graceful=True)


def head(extra: bytes = b"") -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n" + extra


def answer_while(server: BackgroundServer, start: bytes, go_on: Callable[[socket.socket], None] = lambda s: None):
    """Send `start` (an incomplete head), read the answer, then let `go_on` send more."""
    with RawConnection(server.url, 60) as connection:
        connection.send(start)
        answer = connection.answer("POST")
        healthz = httpx.get(server.url + "/healthz")  # another client, while this head is still open
        go_on(connection.sock)
    return answer, healthz


def keep_sending(sock: socket.socket) -> None:
    """The rest of a 64 MB value: the server drops it (or has closed by now)."""
    piece = b"a" * (1 << 20)
    try:
        for _ in range(63):
            sock.sendall(piece)
    except OSError:
        pass


def test_a_64_mb_header_value_is_answered_431_before_it_ends(served):
    # one megabyte of the value, and no end to the head: the answer cannot wait for it
    answer, healthz = answer_while(served, head(b"x-big: " + b"a" * (1 << 20)), keep_sending)
    assert answer is not None and answer.status == 431
    assert answer.json()["error"]["code"] == "headers_too_large"
    assert answer.header("connection") == "close"
    assert healthz.status_code == 200


def test_too_many_header_lines_are_answered_431(served):
    lines = b"".join(b"x-h%d: v\r\n" % i for i in range(MAX_HEADERS + 1))
    answer, healthz = answer_while(served, head(lines))  # no blank line yet: the head is not even complete
    assert answer is not None and answer.status == 431
    assert "header lines" in answer.json()["error"]["message"]
    assert healthz.status_code == 200


def test_heads_within_the_limits_are_served_on_one_connection(served):
    body = json.dumps(GREEDY).encode()
    lines = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 512) for i in range(MAX_HEADERS - 8))
    request = head(lines + b"content-length: %d\r\n\r\n" % len(body)) + body
    with RawConnection(served.url, 60) as connection:
        for _ in range(3):  # keep-alive: each request's head is counted afresh
            connection.send(request)
            answer = connection.answer("POST")
            assert answer is not None and answer.status == 200, answer
            assert answer.json()["choices"]


def test_a_stream_arrives_whole_through_writes_gathered_by_turn(served):
    """Writes wait for the end of their turn at most: a stream's head and events arrive, in order."""
    with httpx.Client(base_url=served.url, timeout=60) as client:
        for _ in range(2):  # and again on the kept-alive connection
            with client.stream("POST", "/v1/chat/completions", json={**GREEDY, "stream": True}) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                events = [line for line in response.iter_lines() if line.startswith("data:")]
            assert events[-1] == "data: [DONE]" and len(events) > 1, events
