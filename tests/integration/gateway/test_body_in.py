"""`specgate serve`'s protocol tells the app whether a request's whole body has
arrived (BODY_IN_EXTENSION): then the body is read without a deadline. It must
say so only when it is true, on 127.0.0.1."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from backends.serving.server import BackgroundServer
from gateway.edge.body import BODY_IN_EXTENSION
from gateway.edge.http_protocol import with_header_timeout
from gateway.edge.response_cycle import ResponseCycle

from .raw_http import RawConnection

BODY = b'{"model": "m"}'
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-length: %d\r\n\r\n" % len(BODY)


class Recorder:
    """An app that notes what the extension said when the request reached it, then echoes the body."""

    def __init__(self) -> None:
        self.said: list[bool] = []
        self.started = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.said.append(scope["extensions"][BODY_IN_EXTENSION]())
        self.started.set()
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def served() -> Iterator[tuple[BackgroundServer, Recorder]]:
    app = Recorder()
    server = BackgroundServer(app, http=with_header_timeout(60.0)).start()
    yield server, app
    server.stop(graceful=True)


def test_a_body_sent_with_its_head_is_in(served) -> None:
    server, app = served
    with RawConnection(server.url, 10) as connection:
        connection.send(HEAD + BODY)
        answer = connection.answer("POST")
    assert answer is not None and answer.body == BODY
    assert app.said == [True]


def test_a_body_that_follows_its_head_is_not_in_until_it_arrives(served) -> None:
    server, app = served
    with RawConnection(server.url, 10) as connection:
        connection.send(HEAD)
        assert app.started.wait(10)  # the app runs with the head alone
        connection.send(BODY)
        answer = connection.answer("POST")
    assert answer is not None and answer.body == BODY
    assert app.said == [False]


def test_the_check_leaves_no_request_to_the_garbage_collector(served) -> None:
    """The check is kept in the request's scope, which its cycle holds: it must not hold the
    cycle, or every request's cycle, scope and transport is freed only by a collection."""
    server, _ = served
    gc.collect()
    gc.disable()
    try:
        with RawConnection(server.url, 10) as connection:
            for _ in range(20):
                connection.send(HEAD + BODY)
                answer = connection.answer("POST")
                assert answer is not None and answer.body == BODY
            alive = [o for o in gc.get_objects() if type(o) is ResponseCycle]  # no lazy module's __class__
    finally:
        gc.enable()
    assert len(alive) <= 1  # the connection's last request's, which its protocol still holds
