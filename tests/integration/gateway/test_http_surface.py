"""The gateway's HTTP surface on raw sockets, in front of fake vLLM servers:
interim answers, HEAD, and which paths may reach a backend."""

from __future__ import annotations

import json

import pytest

from tests.fakes.vllm import FakeVllm

from .conftest import Gateway
from .raw_http import Answer, exchange, leases_outstanding, wait_for

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}).encode()


def post(path: str, rid: str, extra: str = "") -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
            f"x-request-id: {rid}\r\n{extra}content-length: {len(CHAT)}\r\nconnection: close\r\n\r\n")
    return head.encode() + CHAT


def get(target: bytes, rid: str, method: bytes = b"GET", host: bytes = b"gateway") -> bytes:
    return (method + b" " + target + b" HTTP/1.1\r\nhost: " + host + b"\r\nx-request-id: " + rid.encode()
            + b"\r\nconnection: close\r\n\r\n")


def answered(answer: Answer | None) -> Answer:
    assert answer is not None, "the gateway closed the connection without an answer"
    return answer


def backend_paths(*fakes: FakeVllm, since: dict[FakeVllm, int]) -> list[str]:
    """Paths the fakes were asked for since `since` (their request counts), health checks aside."""
    return [r.path for fake in fakes for r in fake.requests[since[fake]:] if r.path != "/health"]


def all_leases_back(gateway: Gateway) -> bool:
    return wait_for(lambda: not leases_outstanding(gateway.app.state.runtime), 10)


def test_expect_100_continue_gets_its_own_final_answer(gateway, std_fake):
    std_fake.script(text="ok", chunks=1, delay=0.2)  # the backend's 100 Continue and its answer go out apart
    route = "x-specgate-route: standard\r\n"
    first = answered(exchange(gateway.url, post("/v1/chat/completions", "first", "expect: 100-continue\r\n" + route)))
    assert first.status == 200, first
    assert first.json()["id"] == "chatcmpl-first"
    # the next request, on the same pooled upstream connection, gets its own answer
    second = answered(exchange(gateway.url, post("/v1/chat/completions", "second", route)))
    assert second.json()["id"] == "chatcmpl-second"
    assert all_leases_back(gateway)


def test_head_on_a_passthrough_path_is_answered_and_frees_its_lease(gateway, spec_fake, std_fake):
    head = answered(exchange(gateway.url, get(b"/v1/files", "head-1", b"HEAD"), "HEAD"))
    assert head.status == 404  # the backend's answer, not a timeout
    assert head.header("x-specgate-rule") == "passthrough"
    assert head.header("x-fake-request-id") == "head-1"
    assert all_leases_back(gateway)
    after = answered(exchange(gateway.url, get(b"/v1/files", "after-head")))
    assert (after.status, after.header("x-fake-request-id")) == (404, "after-head")


UNSAFE_TARGETS = [
    b"/v1/../metrics",
    b"/v1/x/../../metrics",
    b"/v1/./models",
    b"/v1/%2e%2e/metrics",
    b"/v1/%2E%2e/metrics",
    b"/v1/.%2e/metrics",
    b"/v1/models%2F..%2F..%2Fmetrics",
    b"/v1/models%2f..%2f..%2fmetrics",
    b"/v1/..%5cmetrics",
    b"/v1/..%5Cmetrics",
    b"/v1/%252e%252e/metrics",
    b"/v1/a%00b",
    b"/v1/a%0d%0ab",
    b"/v1/" + b"a" * 16384,
]


@pytest.mark.parametrize("target", UNSAFE_TARGETS, ids=lambda t: t[:40].decode())
@pytest.mark.parametrize("method", [b"GET", b"POST"])
def test_unsafe_paths_are_refused_at_the_edge(gateway, spec_fake, std_fake, target, method):
    before = {spec_fake: len(spec_fake.requests), std_fake: len(std_fake.requests)}
    answer = answered(exchange(gateway.url, get(target, "unsafe", method)))
    assert answer.status == 400, answer
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] in ("invalid_path", "target_too_long")
    assert answer.header("x-request-id") == "unsafe"
    assert backend_paths(spec_fake, std_fake, since=before) == []


def test_a_64_kib_path_is_refused_before_any_backend(gateway, spec_fake, std_fake):
    before = {spec_fake: len(spec_fake.requests), std_fake: len(std_fake.requests)}
    answer = answered(exchange(gateway.url, get(b"/v1/" + b"a" * 65536, "long")))
    assert answer.status == 400  # uvicorn's parser refuses a URL this long before the app sees it
    assert backend_paths(spec_fake, std_fake, since=before) == []


def test_hot_routes_see_the_normalised_path(gateway):
    answer = answered(exchange(gateway.url, post("/v1/chat/%63ompletions", "hot")))
    assert answer.status == 200
    assert answer.json()["id"] == "chatcmpl-hot"


def test_passthrough_forwards_the_normalised_path(gateway, spec_fake, std_fake):
    before = {spec_fake: len(spec_fake.requests), std_fake: len(std_fake.requests)}
    answer = answered(exchange(gateway.url, get(b"/v1/files/abc%3adef%41?x=%2F", "plain")))
    assert answer.status == 404
    assert answer.header("x-fake-request-id") == "plain"
    assert backend_paths(spec_fake, std_fake, since=before) == ["/v1/files/abc:defA"]


@pytest.mark.parametrize("host", [b"evil/metrics?", b"evil/metrics#", b"a@evil/metrics?"])
def test_the_host_header_does_not_change_the_forwarded_path(gateway, spec_fake, std_fake, host):
    before = {spec_fake: len(spec_fake.requests), std_fake: len(std_fake.requests)}
    answer = answered(exchange(gateway.url, get(b"/v1/files", "host", host=host)))
    assert answer.status in (400, 404)
    assert backend_paths(spec_fake, std_fake, since=before) in ([], ["/v1/files"])
