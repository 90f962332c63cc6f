"""The edge's request: headers looked up in a dict read as Starlette's `Headers` read, and
targets normalised once and remembered, never a bad one."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers
from starlette.requests import Request

from gateway.edge.paths import KnownTargets, normalise_target
from gateway.edge.request import EdgeRequest, HeaderMap
from gateway.errors import InvalidRequest

RAW = [(b"host", b"gateway"), (b"x-dup", b"first"), (b"content-type", b"application/json"), (b"x-dup", b"second"),
       (b"x-latin", "caf\u00e9".encode("latin-1"))]


@pytest.mark.parametrize("name", ["host", "HOST", "X-Dup", "x-latin", "content-type", "x-missing", ""])
def test_a_header_map_reads_as_starlettes_headers(name: str) -> None:
    mapped, plain = HeaderMap({"headers": RAW}), Headers(scope={"headers": RAW})
    assert mapped.get(name) == plain.get(name)
    assert mapped.get(name, "none") == plain.get(name, "none")
    assert (name in mapped) == (name in plain)
    if name in plain:
        assert mapped[name] == plain[name]
    else:
        with pytest.raises(KeyError):
            mapped[name]


def test_a_header_map_keeps_every_value_for_the_rest_of_headers_api() -> None:
    mapped = HeaderMap({"headers": RAW})
    assert mapped.getlist("x-dup") == ["first", "second"]
    assert mapped.items() == Headers(scope={"headers": RAW}).items()
    assert 42 not in mapped


def test_the_edge_request_reads_its_headers_through_the_map() -> None:
    request = EdgeRequest({"type": "http", "headers": RAW}, receive=None)  # type: ignore[arg-type]  # no body is read
    assert isinstance(request.headers, HeaderMap)
    assert request.headers.get("x-dup") == "first"


async def _receive() -> dict:
    return {"type": "http.request", "body": b"", "more_body": False}


def test_the_edge_request_is_built_as_starlettes_request_is() -> None:
    """Its `__init__` is Starlette's, written out: the same state, so every method of
    Starlette's `Request` (body, stream, json, form, is_disconnected) reads it as its own."""
    scope = {"type": "http", "headers": RAW}
    ours, theirs = EdgeRequest(dict(scope), _receive), Request(dict(scope), _receive)
    state = {k: v for k, v in vars(ours).items() if k != "_header_map"}
    assert state.keys() == vars(theirs).keys()
    assert {k: v for k, v in state.items() if k != "scope"} == {k: v for k, v in vars(theirs).items() if k != "scope"}
    assert ours.receive is _receive and ours.scope["headers"] == RAW


def test_an_edge_request_is_an_http_requests_only() -> None:
    with pytest.raises(ValueError):
        EdgeRequest({"type": "websocket", "headers": RAW}, _receive)


def test_known_targets_are_normalised_as_the_function_does() -> None:
    targets = KnownTargets()
    for raw in (b"/v1/chat/completions", b"//v1//chat/completions/", b"/v1/caf%C3%A9", b"/v1/%7Euser"):
        assert targets(raw) == normalise_target(raw)
        assert targets(raw) == normalise_target(raw)  # the second time from what was kept


def test_a_bad_target_is_refused_every_time_and_never_kept() -> None:
    targets = KnownTargets()
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            targets(b"/v1/../admin")
    assert targets(b"/v1/models") == (b"/v1/models", "/v1/models")


def test_a_target_with_a_query_is_checked_each_time() -> None:
    targets = KnownTargets()
    assert targets(b"/v1/models", b"a=1") == normalise_target(b"/v1/models", b"a=1")
    with pytest.raises(InvalidRequest):
        targets(b"/v1/models", b"a=\x01")


def test_known_targets_keep_at_most_their_size_and_still_answer_past_it() -> None:
    targets = KnownTargets(size=2)
    paths = [f"/v1/p{i}".encode() for i in range(5)]
    assert [targets(p) for p in paths] == [normalise_target(p) for p in paths]
    assert len(targets) == 2


def test_a_long_target_is_answered_but_never_kept() -> None:
    targets = KnownTargets()
    long = b"/v1/" + b"a" * KnownTargets.KEPT_BYTES
    assert targets(long) == normalise_target(long)
    assert len(targets) == 0
