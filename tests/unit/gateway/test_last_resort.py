"""The gateway's outermost layer, `LastResort`, in place of Starlette's ServerErrorMiddleware:
an exception nothing else answered is a 500 in the API's envelope when no response has
started, is never a second response after one has, and is raised on for the server to log."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.edge.error_answers import exception_handlers
from gateway.edge.middleware import GatewayApp, LastResort


class Boom(RuntimeError):
    pass


async def raises(request: Request) -> Response:
    raise Boom("nothing answered this")


class StartsThenRaises:
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        raise Boom("mid-stream")


def app() -> GatewayApp:
    return GatewayApp(routes=[Route("/v1/chat/completions", raises, methods=["POST"]),
                              Route("/v1/completions", StartsThenRaises(), methods=["POST"])],
                      exception_handlers=dict(exception_handlers()))


def call(path: str) -> tuple[list[dict[str, Any]], BaseException | None]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    raised: BaseException | None = None
    try:
        asyncio.run(app()(scope, receive, send))
    except BaseException as exc:  # noqa: BLE001 - the test reads what escaped
        raised = exc
    return sent, raised


def test_the_outermost_layer_is_the_compiled_last_resort() -> None:
    assert isinstance(app().build_middleware_stack(), LastResort)


def test_an_unanswered_error_is_a_500_in_the_envelope_and_is_raised_on() -> None:
    sent, raised = call("/v1/chat/completions")
    assert isinstance(raised, Boom)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 500
    body = json.loads(sent[1]["body"])
    assert body["error"]["message"] == "internal gateway error"


def test_after_the_response_started_no_second_response_goes_out() -> None:
    sent, raised = call("/v1/completions")
    assert isinstance(raised, Boom)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200
    assert sent[1]["body"] == b"data: {}\n\n"


def test_a_debug_app_keeps_starlettes_traceback_pages() -> None:
    debugging = GatewayApp(routes=[], exception_handlers=dict(exception_handlers()), debug=True)
    assert not isinstance(debugging.build_middleware_stack(), LastResort)
