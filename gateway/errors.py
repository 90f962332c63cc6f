"""Errors the gateway answers, each rendered once as an OpenAI error envelope.

    GatewayError                      -> {"error": {"message", "type", "param", "code"}}
    ├── InvalidRequest        400     malformed JSON, wrong types (names the field)
    ├── Unauthorized          401     missing or unknown client API key
    ├── Forbidden             403     admin API disabled or wrong token
    ├── NotFound              404     unknown path, unknown pool
    ├── MethodNotAllowed      405
    ├── PayloadTooLarge       413     body over max_body_bytes
    ├── Shed                  429     refused for its priority while the pool is saturated (Retry-After)
    ├── HangsUp                       answered before the request was read whole: closes the connection
    │   ├── RequestTimeout    408     body not received within body_timeout_s
    │   └── HeadersTooLarge   431     headers over max_header_bytes
    ├── NoHealthyBackend      503     nothing to send the request to (Retry-After)
    │   └── AtCapacity        503     every pool of the chain full, and its wait ran out
    └── UpstreamError                 the backend failed before the first byte
        ├── UpstreamUnreachable   502 connect errors or bad statuses after retries
        └── UpstreamTimeout       504 no first byte within the pool's timeout
            └── DeadlineExceeded  504 the request's own total_s ran out (not the backend's fault)

On `/v1/messages` the same errors are answered in Anthropic's envelope,
`{"type": "error", "error": {"type", "message"}}`, with Anthropic's types:
400 invalid_request_error (and any other 4xx), 401 authentication_error,
403 permission_error, 404 not_found_error, 413 request_too_large,
429 rate_limit_error, other 5xx api_error, and the gateway's 503 becomes
Anthropic's 529 overloaded_error (the status its clients retry on).

Lower layers (httpx, pydantic, json) are translated into these at the
boundary where they are caught, once; nothing else builds an error body.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

OVERLOADED = 529  # Anthropic's status for "try again later", where OpenAI's APIs say 503
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   500: "api_error", OVERLOADED: "overloaded_error"}


class GatewayError(Exception):
    status_code = 500
    error_type = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)

    def answer(self, endpoint: str | None = None) -> tuple[int, dict[str, Any]]:
        """The status and body in the envelope of `endpoint`'s API: Anthropic's
        for "messages", OpenAI's for everything else."""
        if endpoint != "messages":
            return self.status_code, self.body()
        status = OVERLOADED if self.status_code == 503 else self.status_code
        kind = ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return status, {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, headers: dict[str, str] | None = None, endpoint: str | None = None) -> JSONResponse:
        status, body = self.answer(endpoint)
        return JSONResponse(body, status_code=status, headers={**self.headers, **(headers or {})})


class InvalidRequest(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class Unauthorized(GatewayError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(GatewayError):
    status_code = 403
    error_type = "permission_error"


class NotFound(GatewayError):
    status_code = 404
    error_type = "not_found_error"


class MethodNotAllowed(GatewayError):
    status_code = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class HangsUp(GatewayError):
    """An answer sent before the whole request was read (more of it may still
    come): it closes the connection."""

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"connection": "close"})


class RequestTimeout(HangsUp):
    status_code = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class ClientClosed(HangsUp):
    """The client went away before its request was whole (nginx's 499): nobody reads the
    answer, and it is not the gateway's error."""
    status_code = 499
    error_type = "invalid_request_error"
    code = "client_closed_request"


class PayloadTooLarge(GatewayError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class HeadersTooLarge(HangsUp):
    status_code = 431
    error_type = "invalid_request_error"
    code = "headers_too_large"


class Shed(GatewayError):
    """Refused for its priority while the pool is saturated: a lower-priority
    request would otherwise have gone first. Retry-After says when to retry."""
    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: int = 1, reason: str = "full") -> None:
        super().__init__(message, headers={"retry-after": str(retry_after_s)})
        self.reason = reason  # full, evicted or below_threshold: the shed metric's label


class NoHealthyBackend(GatewayError):
    """`reason` names why the pool could not take the request (the fallback
    header says it): ejected, unhealthy, full, busy, or unavailable."""
    status_code = 503
    error_type = "service_unavailable"
    code = "no_healthy_backend"
    default_reason = "unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 1, reason: str | None = None) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after_s)})
        self.reason = reason or self.default_reason


class AtCapacity(NoHealthyBackend):
    """The pools are healthy but full: raised by a full pool (the request may
    wait for a slot), and answered when the wait is refused or runs out."""
    code = "at_capacity"
    default_reason = "full"


class UpstreamError(GatewayError):
    status_code = 502
    error_type = "upstream_error"


class UpstreamUnreachable(UpstreamError):
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    status_code = 504
    code = "upstream_timeout"


class DeadlineExceeded(UpstreamTimeout):
    """The request's own total time ran out while the backend was working:
    the request's outcome, never counted against the endpoint."""
    code = "deadline_exceeded"


def error_body(message: str, error_type: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
