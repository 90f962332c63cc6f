"""Work that stops as soon as the HTTP client goes away.

Starlette's `StreamingResponse` on ASGI 2.4 servers only notices a gone
client at its next write, so a generator paused between tokens would keep
running. Here a watcher waits for `http.disconnect` next to the work and
cancels it the moment the message arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the work finished."""


async def run_until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`; cancel it and raise `ClientGone` if the client leaves
    first. Call it after the request body has been read."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Also on our own cancellation (server shutdown): stop both.
        for task in (work_task, watch_task):
            if not task.done():
                task.cancel()
        for task in (work_task, watch_task):
            with contextlib.suppress(asyncio.CancelledError, ClientGone):
                await task
    if work_task.cancelled():
        raise ClientGone()
    return work_task.result()


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class DisconnectAwareStream(Response):
    """Streams `chunks` unbuffered: each one is sent as soon as it is produced.
    When the client disconnects, the producer is cancelled and closed."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        status_code: int = 200,
        media_type: str = "text/event-stream",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.chunks = chunks
        self.status_code = status_code
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def pump() -> None:
            start = {"type": "http.response.start", "status": self.status_code}
            await send({**start, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await run_until_disconnect(receive, pump())
        except (ClientGone, OSError):
            pass
        finally:
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
