"""The relay's event splitter against the rule it follows: what it passes on ends where the
last whole event of what arrived ends, LF or CRLF, however the stream is cut into chunks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.upstream.events import EventSplitter

ENDS = [b"\n\n", b"\r\n\r\n", b"\n\r\n", b"\r\n\n", b"\r\n", b"\n"]
EVENT = st.one_of(  # an event, or line ends alone (blank lines, an empty event)
    st.builds(lambda data, end: b"data: " + data + end,
              st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")), st.sampled_from(ENDS)),
    st.sampled_from(ENDS))


def last_end(data: bytes) -> int:
    """Where the last event of `data` ends: past the last LF or CRLF pair, whichever is later."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


@given(st.lists(EVENT, max_size=8), st.binary(max_size=5), st.lists(st.integers(0, 200), max_size=6))
def test_each_chunk_passes_on_up_to_the_last_whole_event(events: list[bytes], partial: bytes,
                                                          cuts: list[int]) -> None:
    stream = b"".join(events) + partial.replace(b"\n", b"")
    splitter, held, out = EventSplitter(), b"", []
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    for start, stop in zip(bounds, bounds[1:], strict=False):
        held += stream[start:stop]
        passed = splitter.feed(stream[start:stop])
        assert passed == held[:last_end(held)], (held, passed)
        held = held[len(passed):]
        out.append(passed)
    assert b"".join(out) + splitter.rest() == stream
