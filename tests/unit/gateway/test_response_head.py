"""The response head's checks (gateway/edge/response_cycle.py) refuse what uvicorn's regular
expressions refuse; the head's bytes are held to uvicorn's own in
tests/integration/gateway/test_response_cycle.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.edge.response_cycle import (
    HEADER_NAME_REFUSED,
    HEADER_VALUE_REFUSED,
    NAME_REFUSED,
    VALUE_REFUSED,
    refuses,
)


@given(st.binary(max_size=64))
def test_refuses_what_the_regular_expressions_find(data):
    assert refuses(NAME_REFUSED, data) == (HEADER_NAME_REFUSED.search(data) is not None)
    assert refuses(VALUE_REFUSED, data) == (HEADER_VALUE_REFUSED.search(data) is not None)


def test_every_byte_alone():
    for byte in range(256):
        data = b"x-name" + bytes([byte]) + b"v"
        assert refuses(NAME_REFUSED, data) == (HEADER_NAME_REFUSED.search(data) is not None), byte
        assert refuses(VALUE_REFUSED, data) == (HEADER_VALUE_REFUSED.search(data) is not None), byte
