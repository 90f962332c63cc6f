"""The app's own bound on a request's head, for servers other than `specgate serve`:
the headers' bytes as on the wire (name, ": ", value, CRLF), at the limit served,
one byte over it answered 431 without reaching the app."""

from __future__ import annotations

import asyncio
import json

from gateway.edge.middleware import HeaderLimitMiddleware

LIMIT = 100


def call(headers: list[tuple[bytes, bytes]]) -> tuple[int, dict, bool]:
    reached = False

    async def app(scope, receive, send) -> None:
        nonlocal reached
        reached = True
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": headers}
    asyncio.run(HeaderLimitMiddleware(app, LIMIT)(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body) if body else {}, reached


def test_headers_at_the_limit_reach_the_app():
    # 3 + 4 + 43 = 50 bytes each line, two lines: 100
    assert call([(b"abc", b"x" * 43), (b"def", b"y" * 43)]) == (204, {}, True)


def test_one_byte_over_is_answered_431_in_the_openai_envelope():
    status, body, reached = call([(b"abc", b"x" * 43), (b"def", b"y" * 44)])
    assert (status, reached) == (431, False)
    assert body["error"]["message"] == f"request headers are 101 bytes, over the {LIMIT} byte limit"


def test_many_empty_lines_count_their_separators():
    assert call([(b"", b"")] * 25)[0] == 204
    assert call([(b"", b"")] * 26)[0] == 431
