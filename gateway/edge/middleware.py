"""The ASGI middleware in front of every route: the last resort for an error
nothing else answered, the header size limit, and the request id, path check
and fast path; and the Starlette app that stacks them (`GatewayApp`)."""

from __future__ import annotations

import inspect
import itertools
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import cast
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.edge.endpoints import request_id
from gateway.edge.error_answers import answer_error
from gateway.edge.paths import KnownTargets
from gateway.edge.request import EdgeRequest
from gateway.errors import GatewayError, HeadersTooLarge

FastHandler = Callable[[Request], Awaitable[ASGIApp]]
LastHandler = Callable[[Request, Exception], Awaitable[ASGIApp]]


class GatewayApp(Starlette):
    """Starlette, its outermost layer the compiled `LastResort` in place of its
    ServerErrorMiddleware, with the same handler; and its `__call__` compiled: the
    app's frame is resumed at every wait of every request."""

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        handler = self.exception_handlers.get(Exception)
        if isinstance(stack, ServerErrorMiddleware) and not self.debug and inspect.iscoroutinefunction(handler):
            return LastResort(stack.app, cast(LastHandler, handler))  # an HTTP one: the app serves no websockets
        return stack

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self
        stack = self.middleware_stack
        if stack is None:
            stack = self.middleware_stack = self.build_middleware_stack()
        await stack(scope, receive, send)


class LastResort:
    """Starlette's ServerErrorMiddleware as the gateway uses it (no debug pages, an
    async handler), compiled: an exception that reached the top is answered by
    `handler` if no response has started, and raised on for the server to log.
    Starlette's wraps every `send` in an interpreted closure, a stream's every event."""

    def __init__(self, app: ASGIApp, handler: LastHandler) -> None:
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        watched = _StartWatch(send)
        try:
            await self.app(scope, receive, watched.send)
        except Exception as exc:
            response = await self.handler(Request(scope), exc)
            if not watched.started:
                await response(scope, receive, send)
            raise


class _StartWatch:
    """A `send` that notes whether the response has started."""

    def __init__(self, send: Send) -> None:
        self.started = False
        self._send = send

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class RequestIdMiddleware:
    """Give every request an id before anything can fail (accepted or generated),
    check and normalise its path (gateway.edge.paths) before anything routes on it,
    and send the hot routes straight to their handlers.

    The completion routes carry nearly all traffic; Starlette's exception
    middleware and router wrap every `send` and cost about a tenth of the CPU of
    a small proxied request, so those routes skip them. Errors are answered by
    the same function as on every other route.
    """

    def __init__(self, app: ASGIApp, hot: Mapping[str, FastHandler]) -> None:
        self.app = app
        self.hot = hot
        self.rng = random.Random(os.urandom(16))
        self.targets = KnownTargets()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = EdgeRequest(scope, receive)
        scope.setdefault("state", {})["request_id"] = request_id(request, self.rng)
        try:
            scope["raw_path"], scope["path"] = self.targets(
                scope.get("raw_path") or quote(scope["path"]).encode(), scope.get("query_string", b""))
        except GatewayError as exc:
            await (await answer_error(request, exc))(scope, receive, send)
            return
        handler = self.hot.get(scope["path"]) if scope["method"] == "POST" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(request)
        except Exception as exc:  # noqa: BLE001 - the client gets an envelope, the log the type
            response = await answer_error(request, exc)
        await response(scope, receive, send)


class HeaderLimitMiddleware:
    """Answer 431 to requests whose headers are over `max_bytes` (as on the wire)
    before anything reads or forwards them. Under `specgate serve` the HTTP
    protocol (http_protocol.py) has refused such a head while parsing it; this
    is the bound for any other server the app runs under."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]  # each name and value, with ": " and CRLF: summed in C, no generator
            size = sum(map(len, itertools.chain.from_iterable(headers))) + 4 * len(headers)
            if size > self.max_bytes:
                error = HeadersTooLarge(f"request headers are {size} bytes, over the {self.max_bytes} "
                                        "byte limit")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
