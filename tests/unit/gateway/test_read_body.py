"""read_body takes a request's body off ASGI `receive`: whole, within its byte limit, before
its deadline, and not from a client that left."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from starlette.requests import Request

from gateway.edge.body import BODY_IN_EXTENSION, read_body
from gateway.errors import ClientClosed, PayloadTooLarge, RequestTimeout


def request_of(messages: Sequence[dict[str, Any]], content_length: int | None = None) -> Request:
    """A request whose `receive` gives `messages`, then waits for ever (a client that stalls)."""
    pending = list(messages)

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers, "query_string": b""}, receive)


def part(body: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def read(request: Request, limit: int = 10, timeout_s: float | None = 5.0) -> bytes:
    return asyncio.run(read_body(request, limit, timeout_s))


def test_a_body_in_one_message_is_returned_as_it_came() -> None:
    assert read(request_of([part(b'{"a": 1}')])) == b'{"a": 1}'


def test_a_body_in_several_messages_is_joined() -> None:
    assert read(request_of([part(b"ab", more=True), part(b"", more=True), part(b"cd")])) == b"abcd"


def test_a_message_without_a_body_key_is_an_empty_body() -> None:
    assert read(request_of([{"type": "http.request"}])) == b""


@pytest.mark.parametrize("messages", [[part(b"x" * 10)], [part(b"x" * 6, more=True), part(b"x" * 4)]])
def test_a_body_of_exactly_the_limit_is_read(messages: list[dict[str, Any]]) -> None:
    assert read(request_of(messages), limit=10) == b"x" * 10


@pytest.mark.parametrize("messages", [[part(b"x" * 11)], [part(b"x" * 6, more=True), part(b"x" * 5, more=True)]])
def test_a_body_over_the_limit_is_refused_as_it_arrives(messages: list[dict[str, Any]]) -> None:
    # the second case never ends: the refusal comes once the limit is passed, not at the end
    with pytest.raises(PayloadTooLarge):
        read(request_of(messages), limit=10)


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    with pytest.raises(PayloadTooLarge):
        read(request_of([], content_length=11), limit=10)


@pytest.mark.parametrize("before", [[], [part(b"ab", more=True)]])
def test_a_client_that_leaves_is_not_read_as_a_body(before: list[dict[str, Any]]) -> None:
    with pytest.raises(ClientClosed) as left:  # an error of the client's, not an unhandled one (a 500)
        read(request_of([*before, {"type": "http.disconnect"}]))
    assert left.value.status_code == 499


@pytest.mark.parametrize("before", [[], [part(b"ab", more=True)]])
def test_a_client_that_stalls_is_answered_at_the_deadline(before: list[dict[str, Any]]) -> None:
    with pytest.raises(RequestTimeout):
        read(request_of(before), timeout_s=0.01)


def request_telling(body_in: bool) -> Request:
    """A request whose whole body comes after one turn of the loop, from a server that says
    (BODY_IN_EXTENSION) whether the body is in."""
    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0)
        return part(b"{}")

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b"",
             "extensions": {BODY_IN_EXTENSION: lambda: body_in}}
    return Request(scope, receive)


def test_a_body_the_server_says_is_in_is_read_without_a_deadline() -> None:
    # a deadline of 0 ends the first wait at once: read under one, the turn above would time out
    assert read(request_telling(body_in=True), timeout_s=0) == b"{}"


def test_a_body_the_server_says_is_still_coming_is_read_under_the_deadline() -> None:
    with pytest.raises(RequestTimeout):
        read(request_telling(body_in=False), timeout_s=0)
