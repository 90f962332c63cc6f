"""A request's body, read off ASGI `receive` at the edge: whole, within its byte
limit, before its deadline, and not from a client that left.

A server may put `BODY_IN_EXTENSION` in the scope: a callable that tells whether
the whole body has already arrived (under `specgate serve` it nearly always came
in the same read as the head). Then `receive` answers at once and no deadline
is armed: a timer per request, for a wait that cannot happen, cost about a
fortieth of a small request's CPU.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.types import Receive

from gateway.errors import ClientClosed, PayloadTooLarge, RequestTimeout

BODY_IN_EXTENSION = "specgate.body_in"


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The body, at most `limit` bytes, all of it within `timeout_s` (a client
    that stalls or trickles must not hold a connection and a task forever).
    Read off `receive` (as Starlette's `Request.stream` does, without its async
    generator): a small body is one message, and arrived with the head."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is over the {limit} byte limit")
    body_in = (request.scope.get("extensions") or {}).get(BODY_IN_EXTENSION)
    if timeout_s is None or (body_in is not None and body_in()):
        return await _take(request.receive, limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await _take(request.receive, limit)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None


async def _take(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientClosed("the client closed the connection before its request body was whole")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is over the {limit} byte limit")
        chunks.append(chunk)
        more = message.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
