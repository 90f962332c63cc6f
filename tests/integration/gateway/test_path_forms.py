"""A request path that differs from a documented route only in its slashes
is that route: routed, metered and answered the same, never passed through
to the default pool unrouted. Real gateway and fake vLLM backends on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from .raw_http import exchange
from .test_request_path import GREEDY

FORMS = ["/v1/chat/completions", "//v1/chat/completions", "/v1//chat/completions", "/v1/chat/completions/",
         "/v1/chat//completions//"]


@pytest.mark.parametrize("path", FORMS)
def test_slash_forms_of_the_chat_route_are_routed_alike(gateway, spec_fake, std_fake, path):
    body = json.dumps({**GREEDY, "max_tokens": 8}).encode()  # the short-output rule: the standard pool
    host = gateway.url.removeprefix("http://")
    answer = exchange(gateway.url, (f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                                    f"content-length: {len(body)}\r\n\r\n").encode() + body, "POST")
    assert answer is not None and answer.status == 200, answer
    assert (answer.header("x-specgate-pool"), answer.header("x-specgate-rule")) == ("standard", "short-output")
    assert std_fake.completion_requests()[-1].path == "/v1/chat/completions"
