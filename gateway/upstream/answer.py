"""`Answer`: a backend's response as the proxy reads it.

The part of `httpx.Response` the request path uses (`status_code`, `headers`
with `get` and `raw`, a replaceable `stream`, `aread`, `aiter_raw`, `aclose`,
`is_success`) and nothing more: building an `httpx.Response` and reading its
body through httpx's decoders and chunkers cost about 25 µs a request, its
request twice that. A proxy relays the bytes it got, so nothing is decoded:
a body the backend compressed reaches the client compressed, with its
`content-encoding`, where reading it through httpx had handed the client
plain bytes still labelled compressed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx


class AnswerHeaders:
    """The backend's header lines as they came; `get` reads them as `httpx.Headers` does."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    def get(self, name: str, default: str = "") -> str:
        """Every value of `name` (any case), joined by ", " as HTTP folds them; `default` without one."""
        key = name.lower().encode("latin-1")
        values = [value.decode("latin-1") for found, value in self.raw if found.lower() == key]
        return ", ".join(values) if values else default


class Answer:
    """`ended`, when given, tells whether the body has been read to its end (the transport's
    stream knows; an httpx stream does not say, so an answer `of` one never has)."""

    __slots__ = ("status_code", "headers", "stream", "_closed", "_ended")

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], stream: httpx.AsyncByteStream,
                 ended: Callable[[], bool] | None = None) -> None:
        self.status_code = status_code
        self.headers = AnswerHeaders(headers)
        self.stream = stream  # exchange.py wraps it (trace, token meter) before the relay reads it
        self._closed = False
        self._ended = ended

    @classmethod
    def of(cls, response: httpx.Response) -> Answer:
        """An httpx transport's response (a test's `MockTransport`) read the same way."""
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)  # an async transport's response streams asynchronously
        return cls(response.status_code, response.headers.raw, stream)

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def ended(self) -> bool:
        """Whether the body's last byte has been read, so no read is left to wait for (False when
        the stream cannot tell)."""
        return self._ended is not None and self._ended()

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; the answer is closed once they end or fail (a reader that
        stops before has the claim that holds the answer close it)."""
        return _RawChunks(self)

    async def aread(self) -> bytes:
        """The whole body; the answer is closed after it (or its error). Off the stream
        itself: `aiter_raw`'s async generator costs a non-streamed answer more than its read."""
        try:
            chunks = [chunk async for chunk in self.stream]
        finally:
            await self.aclose()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.stream.aclose()


class _RawChunks:
    """`Answer.aiter_raw`: an iterator of its own rather than an async generator, which mypyc cannot compile."""

    __slots__ = ("_answer", "_chunks")

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self._chunks = answer.stream.__aiter__()

    def __aiter__(self) -> _RawChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except BaseException:  # the end (StopAsyncIteration) or a failure: the answer is done with
            await self._answer.aclose()
            raise
