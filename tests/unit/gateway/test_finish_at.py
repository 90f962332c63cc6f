"""`finish_at` against the regex it replaced: the first `"finish_reason"` key whose value is a
string, with any whitespace around the colon, wherever the runs of events put it."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from gateway.upstream.usage import finish_at

FINISH = re.compile(rb'"finish_reason"\s*:\s*"')
PIECES = [b'"finish_reason"', b":", b'"', b"null", b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c", b"data: ", b"{",
          b"}", b'"stop"', b"x", b'"finish_reason', b'finish_reason"']


SPACES = st.lists(st.sampled_from([b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c"]), max_size=3).map(b"".join)
KEYS = st.builds(lambda before, colon, after, value: b'"finish_reason"' + before + colon + after + value,
                 SPACES, st.sampled_from([b":", b"", b";"]), SPACES, st.sampled_from([b'"', b"null", b"", b"x"]))


@given(st.lists(st.one_of(st.sampled_from(PIECES), KEYS), max_size=20))
def test_it_finds_what_the_regex_found(pieces: list[bytes]) -> None:
    data = b"".join(pieces)
    found = FINISH.search(data)
    assert finish_at(data) == (found.start() if found else -1), data


def test_a_chunk_of_its_own_and_one_of_many() -> None:
    last = b'data: {"choices":[{"index":0,"delta":{},"finish_reason": "stop"}]}\n\n'
    running = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
    assert finish_at(running * 16) == -1
    assert finish_at(running * 3 + last) == 3 * len(running) + last.index(b'"finish_reason"')
