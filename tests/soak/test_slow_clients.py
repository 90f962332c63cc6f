"""Clients that misbehave on the way in: a body that stalls or trickles is cut
off after SPECGATE_BODY_TIMEOUT_S with a 408 envelope and the connection
closed; headers that do not arrive within SPECGATE_HEADER_TIMEOUT_S close the
connection; headers over SPECGATE_MAX_HEADER_BYTES get a 431 envelope and
never reach a backend; a client that stops reading a stream is reset after
SPECGATE_WRITE_TIMEOUT_S. uvicorn with httptools bounds none of these."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.vllm import FakeVllm
from tests.fakes.waiting import wait_until
from tests.integration.gateway.test_request_path import kernel_buffer_bytes
from tests.soak.gateway_process import GatewayProcess, one_pool_policy

pytestmark = [pytest.mark.soak, pytest.mark.timeout(120)]

BODY_TIMEOUT_S = 1.0
HEADER_TIMEOUT_S = 1.0
WRITE_TIMEOUT_S = 1.0
BODY = json.dumps({"model": "fake-model", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "Tell me about rivers."}]}).encode()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="fake-model", kind="standard") as started:
        yield started


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, fake) -> Iterator[GatewayProcess]:
    tmp: Path = tmp_path_factory.mktemp("slow-clients")
    process = GatewayProcess(one_pool_policy(tmp, {"endpoints": [{"url": fake.url}]}), tmp / "gateway.log",
                             env={"SPECGATE_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
                                  "SPECGATE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
                                  "SPECGATE_WRITE_TIMEOUT_S": str(WRITE_TIMEOUT_S)}).start()
    yield process
    process.stop()


def head(content_length: int, extra: bytes = b"") -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%s\r\n" % (content_length, extra))


def read_until_closed(sock: socket.socket, limit_s: float) -> bytes:
    """Everything the gateway sends until it closes the connection (or `limit_s` passes)."""
    sock.settimeout(limit_s)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        received += b"<still open>"
    except ConnectionResetError:
        # Closing with bytes of ours still unread (a byte trickled in after the answer
        # left) makes the kernel reset the connection: what arrived before it stands.
        pass
    return received


def status_and_envelope(raw: bytes) -> tuple[int, dict]:
    headers, _, body = raw.partition(b"\r\n\r\n")
    status = int(headers.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def test_a_body_that_stalls_gets_408_and_the_connection_closes(gateway):
    stalled = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(20)]
    started = time.monotonic()
    for sock in stalled:
        sock.sendall(head(len(BODY)) + BODY[:20])  # then nothing more
    deadline = started + BODY_TIMEOUT_S + 5
    answers = [read_until_closed(sock, limit_s=max(0.1, deadline - time.monotonic())) for sock in stalled]
    for sock in stalled:
        sock.close()
    for raw in answers:
        assert not raw.endswith(b"<still open>"), raw
        status, error = status_and_envelope(raw)
        assert status == 408
        assert error["code"] == "request_timeout" and "body" in error["message"]


def test_a_trickling_body_is_bounded_by_the_same_timeout(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head(len(BODY)))
        started = time.monotonic()
        sock.settimeout(0.2)
        for byte in BODY[:-1]:  # one byte every 0.2 s, never the last one
            try:
                if sock.recv(65536, socket.MSG_PEEK):
                    break  # the gateway answered
            except TimeoutError:
                pass
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # closed under us: the answer is already there
                break
            if time.monotonic() - started > BODY_TIMEOUT_S + 5:
                break
        raw = read_until_closed(sock, limit_s=5)
    status, error = status_and_envelope(raw)
    assert status == 408 and error["code"] == "request_timeout"


def test_a_body_sent_in_time_is_served(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head(len(BODY), b"connection: close\r\n") + BODY[:20])
        time.sleep(BODY_TIMEOUT_S / 4)
        sock.sendall(BODY[20:])
        raw = read_until_closed(sock, limit_s=10)
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    assert json.loads(raw.partition(b"\r\n\r\n")[2])["choices"]


@pytest.mark.parametrize("size", [100_000, 1_000_000])
def test_oversized_headers_get_431_and_never_reach_a_backend(gateway, fake, size):
    before = len(fake.completion_requests())
    big = b"x-padding: " + b"a" * size + b"\r\n"
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head(len(BODY), big) + BODY)
        raw = read_until_closed(sock, limit_s=10)
    assert not raw.endswith(b"<still open>"), raw[:200]
    status, error = status_and_envelope(raw)
    assert status == 431 and error["code"] == "headers_too_large"
    assert len(fake.completion_requests()) == before


@pytest.mark.parametrize("request_head", [
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 5\r\n"
    b"transfer-encoding: chunked\r\n\r\n",
    b"P@ST /v1/chat/completions HTTP/1.1\r\nhost: g\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nbad header: 1\r\n\r\n",
], ids=["two-content-lengths", "length-and-chunked", "bad-method", "bad-header-name"])
def test_requests_the_parser_refuses_get_a_400_envelope(gateway, fake, request_head):
    before = len(fake.completion_requests())
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(request_head + b"hello")
        raw = read_until_closed(sock, limit_s=10)
    assert not raw.endswith(b"<still open>"), raw[:200]
    status, error = status_and_envelope(raw)
    assert status == 400 and error["code"] == "invalid_http" and error["type"] == "invalid_request_error"
    assert len(fake.completion_requests()) == before


def test_the_gateway_keeps_serving_and_holds_no_extra_files_afterwards(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head(len(BODY), b"connection: close\r\n") + BODY)
        assert read_until_closed(sock, limit_s=10).startswith(b"HTTP/1.1 200")
    baseline = gateway.open_fds()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(head(len(BODY)) + BODY[:5])
            read_until_closed(sock, limit_s=BODY_TIMEOUT_S + 5)
    time.sleep(0.5)
    assert gateway.open_fds() <= baseline


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/co", head(len(BODY))[:-30]],
                         ids=["nothing", "half-a-request-line", "half-the-headers"])
def test_headers_that_never_finish_close_the_connection(gateway, sent):
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        started = time.monotonic()
        sock.sendall(sent)
        raw = read_until_closed(sock, limit_s=HEADER_TIMEOUT_S + 5)
        waited = time.monotonic() - started
    assert raw == b""  # closed, nothing said: the request never began
    assert waited > HEADER_TIMEOUT_S - 0.1  # and not before its deadline


def test_a_keep_alive_connection_gets_the_same_deadline_for_its_next_request(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head(len(BODY)) + BODY)
        sock.settimeout(10)
        first = b""
        while b"\r\n\r\n" not in first or not first.rstrip().endswith(b"}"):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gat")  # and stall
        # uvicorn drops its keep-alive timer once a byte of the next request arrives:
        # without the header deadline this connection would stay open for ever.
        raw = read_until_closed(sock, limit_s=HEADER_TIMEOUT_S + 5)
    assert raw == b""


def test_a_client_that_stops_reading_is_reset_not_left_to_drain(gateway, fake):
    piece = "x" * 16_383 + " "
    pieces = (kernel_buffer_bytes() + (8 << 20)) // len(piece)  # more than the sockets hold
    fake.script(text=piece * pieces, chunks=pieces, delay=0.001)
    cancelled = len(fake.disconnects)
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    try:
        reader.connect(("127.0.0.1", gateway.port))
        body = json.dumps({**json.loads(BODY), "stream": True, "max_tokens": 100_000}).encode()
        reader.sendall(head(len(body)) + body)  # and stop reading
        wait_until(lambda: len(fake.disconnects) > cancelled, "the backend saw its request cancelled", timeout=60)
        # A graceful close would wait for the client to drain what is queued, then end
        # with a FIN; the gateway resets the connection instead, and holds nothing.
        reader.settimeout(30)
        with pytest.raises(ConnectionResetError):
            while reader.recv(1 << 20):
                pass
    finally:
        reader.close()
        fake.script(text="ok")
