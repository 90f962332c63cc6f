"""How an exception becomes the client's answer, in one place: the app's
exception handlers and the fast path (gateway.edge.middleware) both answer
through `answer_error`, in the envelope of the API the path belongs to
(Anthropic's on /v1/messages). Every answer carries the request's id."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.decide.api_paths import endpoint_of
from gateway.errors import GatewayError, InvalidRequest, MethodNotAllowed, NotFound

ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


async def answer_error(request: Request, exc: Exception) -> Response:
    """The envelope for `exc`: a GatewayError as it says, a routing miss as a
    404 or 405, anything else a 500 whose type goes to the log."""
    endpoint = endpoint_of(request.url.path)  # the API whose envelope the client reads
    if isinstance(exc, GatewayError):
        response: Response = exc.response(endpoint=endpoint)
    elif isinstance(exc, HTTPException):
        response = _routing_error(request, exc).response(dict(exc.headers or {}), endpoint)
    else:
        structlog.get_logger("specgate").error("unhandled_error", error=type(exc).__name__,
                                               path=request.url.path)
        response = GatewayError("internal gateway error").response(endpoint=endpoint)
    rid = getattr(request.state, "request_id", None)
    if rid:
        response.headers["x-request-id"] = rid
    return response


def exception_handlers() -> Mapping[type[Exception], ErrorHandler]:
    """Starlette's handlers: every kind of error answered by `answer_error`."""
    return {GatewayError: answer_error, HTTPException: answer_error, Exception: answer_error}


def _routing_error(request: Request, exc: HTTPException) -> GatewayError:
    if exc.status_code == 405:
        return MethodNotAllowed(f"method {request.method} is not allowed on {request.url.path}")
    if exc.status_code == 404:
        return NotFound(f"no route for {request.method} {request.url.path}")
    return InvalidRequest(str(exc.detail))  # routing raises only 404 and 405; anything else is the client's fault too
