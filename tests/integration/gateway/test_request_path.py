"""One client cannot hurt another: what a request holds (a lease, the in-flight
gauge, an upstream connection) always comes back, bad input is refused before
anything is held, and a pool that cannot take a request hands it on before
its first byte. Real gateway, fake vLLM backends, all on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from backends.serving.server import BackgroundServer
from gateway.edge.load_view import DecisionLoad
from tests.fakes.waiting import wait_until

from .conftest import Gateway, policy_dict
from .raw_http import exchange

MESSAGES = [{"role": "user", "content": "Tell me about rivers."}]
GREEDY = {"model": "m", "messages": MESSAGES, "temperature": 0, "max_tokens": 128}


def accounting(gateway: Gateway) -> dict[str, tuple[int, list[int], float | None]]:
    """Per pool: its in-flight count, each endpoint's outstanding count, and the gauge."""
    registry = gateway.app.state.metrics.registry
    return {name: (pool.in_flight, [e.outstanding for e in pool.endpoints],
                   registry.get_sample_value("specgate_in_flight", {"pool": name}))
            for name, pool in gateway.app.state.runtime.pools.items()}


def idle(gateway: Gateway) -> bool:
    return all(in_flight == 0 and not any(outstanding) and gauge in (None, 0.0)
               for in_flight, outstanding, gauge in accounting(gateway).values())


def assert_idle(gateway: Gateway) -> None:
    """Every pool, endpoint and gauge back at 0 (the pool's own books, not only the gauge)."""
    wait_until(lambda: idle(gateway), f"nothing in flight (now {accounting(gateway)})", timeout=15)
    assert all(load == 0 for load in DecisionLoad(gateway.app.state.runtime)().values())


def post(gateway: Gateway, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(gateway.base_url + "/chat/completions", json=body, **kwargs)


def test_a_header_byte_that_cannot_be_forwarded_is_a_400_and_holds_nothing(gateway, spec_fake):
    for _ in range(12):  # more than the default policy's `busy` threshold of 8
        response = post(gateway, GREEDY, headers={"x-trace": b"caf\xe9"})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "x-trace"
        assert response.headers["x-request-id"]
    assert_idle(gateway)
    assert spec_fake.completion_requests() == []
    after = post(gateway, GREEDY)
    assert (after.status_code, after.headers["x-specgate-pool"]) == (200, "speculative")
    assert_idle(gateway)


@pytest.mark.parametrize("path", [b"/v1/embeddings%01x", b"/v1/" + b"a" * 65_526])  # 65,530: httpx's URL limit
def test_a_path_the_transport_cannot_send_is_a_400_and_holds_nothing(gateway, std_fake, path):
    body = b'{"model": "m", "input": "x"}'
    answer = exchange(gateway.url, b"POST %s HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (path, len(body), body), "POST")
    assert answer is not None and answer.status == 400, answer
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
    assert std_fake.completion_requests() == []
    assert_idle(gateway)


def test_headers_named_by_connection_and_expect_stay_with_the_gateway(gateway, spec_fake):
    headers = {"connection": "keep-alive, x-private", "x-private": "for this hop only", "x-custom": "kept",
               "expect": "100-continue"}
    response = post(gateway, GREEDY, headers=headers)
    assert response.status_code == 200
    seen = spec_fake.completion_requests()[-1].headers
    assert seen["x-custom"] == "kept"
    assert "x-private" not in seen
    assert "expect" not in seen
    assert_idle(gateway)


async def hop_header_backend(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers everything with headers a proxy must not pass on as they are."""
    body = b'{"object": "chat.completion", "choices": []}'
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
        (b"connection", b"x-backend-hop"), (b"x-backend-hop", b"for one hop"), (b"x-kept", b"yes"),
        (b"x-specgate-pool", b"spoofed")]})
    await send({"type": "http.response.body", "body": body})


def test_headers_the_backend_connection_names_stay_with_the_gateway(start_gateway, std_fake):
    with BackgroundServer(hop_header_backend) as backend:
        gw = start_gateway(policy_dict([backend.url], [std_fake.url]))
        response = post(gw, GREEDY)
    assert response.status_code == 200
    assert response.headers["x-kept"] == "yes"
    assert "x-backend-hop" not in response.headers
    assert response.headers.get_list("x-specgate-pool") == ["speculative"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_gateway_request_id_replaces_the_backend_echo(gateway, spec_fake, stream):
    spec_fake.echo_request_id = True  # as vLLM with --enable-request-id-headers
    with httpx.stream("POST", gateway.base_url + "/chat/completions", headers={"x-request-id": "abc-123"},
                      json={**GREEDY, "stream": stream}) as response:
        response.read()
    assert response.status_code == 200
    assert spec_fake.completion_requests()[-1].headers["x-request-id"] == "abc-123"  # it did echo
    assert response.headers.get_list("x-request-id") == ["abc-123"]
    assert response.headers.get_list("x-specgate-pool") == ["speculative"]


def test_clients_that_leave_before_the_headers_do_not_eject_a_healthy_endpoint(gateway, spec_fake):
    spec_fake.script(text="a b c d e f g h", chunks=8, delay=0.3)  # no headers before the whole answer
    for left in range(1, 4):  # the test policy ejects after 2 failures
        with pytest.raises(httpx.ReadTimeout):
            post(gateway, GREEDY, timeout=httpx.Timeout(5, read=0.2))
        wait_until(lambda left=left: len(spec_fake.disconnects) == left, "the backend saw the request cancelled")
        assert_idle(gateway)
    endpoint = gateway.app.state.runtime.pools["speculative"].endpoints[0]
    assert (endpoint.failures, endpoint.ejected()) == (0, False)
    spec_fake.script(delay=0.0)
    assert post(gateway, GREEDY).headers["x-specgate-pool"] == "speculative"


def slow_health(policy: dict) -> dict:
    """Health checks that will not notice a dead backend during the test."""
    for pool in policy["pools"].values():
        pool["health"] = {**pool["health"], "interval_s": 300}
    return policy


def test_a_killed_backend_falls_back_before_the_first_byte(start_gateway, spec_fake, std_fake):
    gw = start_gateway(slow_health(policy_dict([spec_fake.url], [std_fake.url])))
    assert post(gw, GREEDY).headers["x-specgate-pool"] == "speculative"
    spec_fake.stop()  # killed; the health checks have not seen it yet
    for stream in (False, True):
        with httpx.stream("POST", gw.base_url + "/chat/completions", json={**GREEDY, "stream": stream}) as answer:
            body = answer.read().decode()
        assert answer.status_code == 200, body
        assert answer.headers["x-specgate-pool"] == "standard"
        assert answer.headers["x-specgate-rule"] == "default"
        assert answer.headers["x-specgate-reason"] == "fallback:unreachable"
        assert std_fake.completion_requests()[-1].body["model"] == "upstream-std"
    assert_idle(gw)
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'specgate_requests_total{api="chat",code="200",pool="standard",rule="default"} 2.0' in metrics


def test_a_pool_answering_503_after_its_retries_falls_back(gateway, spec_fake, std_fake):
    spec_fake.fail_next(1, status=503)
    response = post(gateway, GREEDY)
    assert response.status_code == 200
    assert (response.headers["x-specgate-pool"], response.headers["x-specgate-reason"]) == \
        ("standard", "fallback:status_503")
    assert len(spec_fake.completion_requests()) == 1
    assert_idle(gateway)


def test_a_full_pool_falls_back_and_a_key_never_leaves_its_pools(start_gateway, spec_fake, std_fake):
    gw = start_gateway(policy_dict([spec_fake.url], [std_fake.url], max_in_flight=1, queue={"max_waiting": 0}),
                       api_keys="any-pool,spec-only:speculative")
    hold = spec_fake.hold()
    try:
        with httpx.stream("POST", gw.base_url + "/chat/completions", headers={"authorization": "Bearer any-pool"},
                          json={**GREEDY, "stream": True}) as first:
            assert first.headers["x-specgate-pool"] == "speculative"
            assert spec_fake.holding.wait(5)
            full = post(gw, GREEDY, headers={"authorization": "Bearer any-pool"})
            assert (full.status_code, full.headers["x-specgate-pool"]) == (200, "standard")
            assert full.headers["x-specgate-reason"] == "fallback:full"
            limited = post(gw, GREEDY, headers={"authorization": "Bearer spec-only"})
            assert limited.status_code == 429  # its one pool is full and queues nobody: shed
            assert limited.headers["x-specgate-pool"] == "speculative"
            hold.set()
    finally:
        spec_fake.release()
    assert_idle(gw)


def stream_request(host: str, port: int) -> bytes:
    body = json.dumps({**GREEDY, "stream": True, "max_tokens": 100_000}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def kernel_buffer_bytes() -> int:
    """The most the kernel can hold between a backend and a client that does not
    read: the backend's send buffer, the gateway's receive and send buffers."""
    try:
        rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
        wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        rmem, wmem = 32 << 20, 4 << 20
    return rmem + 2 * wmem


def test_a_client_that_stops_reading_is_cut_and_holds_nothing(start_gateway, spec_fake, std_fake):
    gw = start_gateway(policy_dict([spec_fake.url], [std_fake.url]), write_timeout_s=1.0)
    piece = "x" * 16_383 + " "
    # an answer the sockets cannot hold: the backend is still sending when the client is cut
    pieces = (kernel_buffer_bytes() + (8 << 20)) // len(piece)
    spec_fake.script(text=piece * pieces, chunks=pieces, delay=0.001)  # a pause: where a cancel lands
    host, port = gw.server.host, gw.server.port
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    try:
        reader.connect((host, port))
        reader.sendall(stream_request(host, port))  # and never read
        wait_until(lambda: spec_fake.disconnects, "the backend saw its request cancelled", timeout=60)
        assert spec_fake.disconnects[-1].chunks_sent < pieces
        assert_idle(gw)
    finally:
        reader.close()
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'specgate_requests_total{api="chat",code="499",pool="speculative",rule="default"} 1.0' in metrics


def test_a_client_that_leaves_before_the_first_byte_is_logged_with_the_endpoint_it_reached(
        start_gateway, spec_fake, std_fake, capsys):
    gw = start_gateway(policy_dict([spec_fake.url], [std_fake.url]))
    spec_fake.delay_first_byte(30.0)  # past the pool's first_byte_s: only the client's leaving ends it sooner
    host, port = gw.server.host, gw.server.port
    with socket.create_connection((host, port)) as client:
        client.sendall(stream_request(host, port))
        wait_until(spec_fake.completion_requests, "the backend has the request")
    out: list[str] = []

    def logged() -> list[str]:
        out.extend(line for line in capsys.readouterr().out.splitlines() if " request " in line)
        return out

    wait_until(logged, "the request's log line")
    assert len(out) == 1 and "status=499" in out[0] and "ttfb=" not in out[0], out
    assert f"endpoint={spec_fake.url}" in out[0] and "endpoint_why=" in out[0], out
    assert_idle(gw)


@pytest.mark.parametrize("field,value", [("n", 100_000), ("best_of", 17), ("max_tokens", 10**9),
                                         ("max_completion_tokens", 131_073)])
def test_fields_over_their_limits_are_a_400_naming_the_field(gateway, spec_fake, field, value):
    response = post(gateway, {**GREEDY, field: value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field
    assert spec_fake.completion_requests() == []


def test_max_tokens_is_bounded_by_the_pool_context_length(start_gateway, spec_fake, std_fake):
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["pools"]["speculative"]["max_model_len"] = 2048
    gw = start_gateway(policy)
    over = post(gw, {**GREEDY, "max_tokens": 4096})
    assert (over.status_code, over.json()["error"]["param"]) == (400, "max_tokens")
    assert spec_fake.completion_requests() == []
    within = post(gw, {**GREEDY, "max_tokens": 2048, "n": 1})
    assert (within.status_code, within.headers["x-specgate-pool"]) == (200, "speculative")


@pytest.mark.parametrize("stream", [False, True])
def test_a_large_prompt_is_sent_on_whole_with_the_pool_model_and_the_usage_ask(gateway, spec_fake, stream):
    prompt = "Rivers, café and 東京: " * 20_000  # ~0.5 MB: its text is copied on, not serialised again
    body = {**GREEDY, "messages": [{"role": "user", "content": prompt}], "stream": stream, "user": "u1"}
    raw = json.dumps(body, ensure_ascii=False, indent=1).encode()
    response = httpx.post(gateway.base_url + "/chat/completions", content=raw,
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 200, response.text
    sent = spec_fake.completion_requests()[-1].body
    usage = {"stream_options": {"include_usage": True}} if stream else {}
    assert sent == {**body, "model": "upstream-spec", **usage}
    assert list(sent)[:len(body)] == list(body)  # the client's fields keep their order
    assert_idle(gateway)


def test_a_large_bad_body_is_a_400_in_the_callers_envelope_and_holds_nothing(gateway, spec_fake):
    raw = json.dumps({**GREEDY, "messages": [{"role": "user", "content": "x" * 200_000}]}).encode()[:-1] + b",}"
    for path, top in (("/chat/completions", {"error"}), ("/messages", {"type", "error"})):  # OpenAI's, Anthropic's
        response = httpx.post(gateway.base_url + path, content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        assert set(response.json()) == top
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert "not valid JSON" in response.json()["error"]["message"]
    assert spec_fake.completion_requests() == []
    assert_idle(gateway)
