"""A stream's server-sent events, passed on whole: the relay's splitter (relay.py)."""

from __future__ import annotations

from gateway.upstream.usage import UsageTap


class EventSplitter:
    """Passes on whole server-sent events as soon as they are complete and keeps
    a trailing partial event back, so a stream that breaks never leaves the
    client half an event (which it could not parse). Whole events go through
    the exchange's `UsageTap` when it has one."""

    MAX_PENDING = 1 << 20  # an "event" this large is not SSE: pass it on as it is

    def __init__(self, tap: UsageTap | None = None) -> None:
        self.pending = b""
        self.tap = tap

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk if self.pending else chunk
        lf = data.rfind(b"\n\n")  # a CRLF end counts only past it: not searched for back through LF ends
        crlf = data.rfind(b"\r\n\r\n", lf + 1)  # (a stream's kilobytes that came at once); no LF end: all
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if not end:
            if len(data) < self.MAX_PENDING:
                self.pending = data
                return b""
            end = len(data)
        self.pending = data[end:]
        return data[:end] if self.tap is None else self.tap.feed(data[:end])

    def rest(self) -> bytes:
        """The end of the stream: what is left, whole or not."""
        rest, self.pending = self.pending, b""
        return rest if self.tap is None else self.tap.feed(rest) + self.tap.flush()

    def held(self) -> bytes:
        """The whole events the tap still holds, for a stream that broke (the partial one is dropped)."""
        return b"" if self.tap is None else self.tap.flush()
