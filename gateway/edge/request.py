"""`EdgeRequest`: the request the middleware hands the hot routes, its headers a
`HeaderMap` (Starlette's `Headers`, looked up in a dict built once). A
generation request asks for half a dozen headers, most of them absent
(`x-request-id`, the priority and routing headers, a session header), and in
Starlette's list each miss scanned every header and raised and caught a
`KeyError`.

Its `__init__` sets what Starlette's `Request.__init__` and `HTTPConnection.__init__`
set, written out where it may run compiled (two interpreted frames a request);
tests/unit/gateway/test_edge_request.py holds it to Starlette's."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request, empty_send
from starlette.types import Receive, Scope


class HeaderMap(Headers):
    def __init__(self, scope: Scope) -> None:
        # what Headers(scope=scope) does, here where it may run compiled: its __init__ runs interpreted
        self._list = scope["headers"] = list(scope["headers"])
        self._first = dict(reversed(self._list))  # a name sent twice reads as its first value, as in Headers

    def __getitem__(self, key: str) -> str:
        return self._first[key.lower().encode("latin-1")].decode("latin-1")

    def __contains__(self, key: Any) -> bool:
        return isinstance(key, str) and key.lower().encode("latin-1") in self._first

    def get(self, key: str, default: Any = None) -> Any:
        value = self._first.get(key.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    # Starlette's own, here where it may run compiled; a list, as Starlette's is, not Mapping's ItemsView
    def items(self) -> list[tuple[str, str]]:  # type: ignore[override]  # the list Starlette returns
        return [(key.decode("latin-1"), value.decode("latin-1")) for key, value in self._list]


class EdgeRequest(Request):
    def __init__(self, scope: Scope, receive: Receive) -> None:
        if scope["type"] != "http":
            raise ValueError("an EdgeRequest is an HTTP request's")
        self.scope = scope
        self._receive = receive
        self._send = empty_send
        self._stream_consumed = False
        self._is_disconnected = False
        self._form = None
        self._header_map = HeaderMap(scope)

    @property
    def headers(self) -> Headers:
        return self._header_map

    @property
    def receive(self) -> Receive:
        return self._receive
