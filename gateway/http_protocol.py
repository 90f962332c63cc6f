"""uvicorn's httptools protocol with a deadline for request headers.

uvicorn arms no timer before a request's headers are complete: a client that
connects and sends nothing, or sends half a request line and stalls, holds
its connection (a file descriptor) forever. Here every request's line and
headers must arrive within `header_timeout_s` of the connection opening (for
the first request) or of the request's first byte (for the next ones on a
keep-alive connection); otherwise the connection is closed. Idle time
between requests stays uvicorn's keep-alive timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class to give uvicorn as `http=`, with this deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": seconds})
