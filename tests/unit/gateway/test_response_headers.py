"""The backend's response headers as the gateway passes them on (gateway/upstream/headers.py)."""

from __future__ import annotations

from gateway.upstream.answer import AnswerHeaders
from gateway.upstream.headers import response_headers


def test_hop_by_hop_and_the_servers_own_headers_stop_at_the_gateway():
    raw = [(b"Content-Type", b"text/event-stream"), (b"Transfer-Encoding", b"chunked"), (b"Date", b"then"),
           (b"Server", b"uvicorn"), (b"Keep-Alive", b"timeout=5"), (b"x-vllm-id", b"7")]
    assert response_headers(AnswerHeaders(raw), {}) == [(b"content-type", b"text/event-stream"),
                                                        (b"x-vllm-id", b"7")]


def test_what_a_backends_connection_header_names_stops_too_in_any_case():
    raw = [(b"CONNECTION", b"keep-alive, X-Private"), (b"x-private", b"secret"), (b"X-Kept", b"yes"),
           (b"connection", b" x-other ,"), (b"X-Other", b"no")]
    assert response_headers(AnswerHeaders(raw), {}) == [(b"x-kept", b"yes")]


def test_the_gateways_own_headers_replace_the_backends():
    raw = [(b"X-Request-Id", b"backend's"), (b"content-type", b"application/json")]
    extra = {"x-request-id": "ours", "x-specgate-pool": "speculative"}
    assert response_headers(AnswerHeaders(raw), extra) == [
        (b"content-type", b"application/json"), (b"x-request-id", b"ours"), (b"x-specgate-pool", b"speculative")]
