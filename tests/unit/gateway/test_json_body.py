"""A large body is parsed as json.loads parses it, and sent on with a few
top-level fields changed by copying the other values' text as the client
wrote it; bad bodies fail exactly as json.loads fails."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.decide.features import parse_json, parse_json_body
from gateway.decide.json_body import (
    INTEGER_AS_FLOAT,
    MAX_SPANS,
    ORJSON_DEPTH,
    SPAN_BYTES,
    dumps_with,
    loads,
    read_as_json_loads,
)
from gateway.errors import InvalidRequest

PAD = " " * SPAN_BYTES  # JSON whitespace: makes any body large enough to be walked


def big(text: str) -> bytes:
    return (text + PAD).encode()


@pytest.mark.parametrize("content", ["plain ascii " * 10_000, "café, 東京 and 🙂 " * 5_000])
def test_unchanged_values_are_sent_as_the_client_wrote_them(content):
    messages = '[ {"role" : "user",\n  "content": ' + json.dumps(content, ensure_ascii=False) + "} ]"
    raw = ('{"model": "client-model", "messages" : ' + messages + ', "stream": true, "temperature": 0.5}').encode()
    parsed = parse_json(raw)
    assert parsed.spans is not None
    assert (parsed.spans.text is None) == content.isascii()  # an ASCII body is sliced from its bytes
    assert parsed.value == json.loads(raw)
    sent = dumps_with(parsed.value, {"model": "pool-model", "stream_options": {"include_usage": True}}, parsed.spans)
    assert json.loads(sent) == {**json.loads(raw), "model": "pool-model", "stream_options": {"include_usage": True}}
    assert messages.encode() in sent  # its spacing and its UTF-8 kept: copied, not serialised again
    assert list(json.loads(sent)) == ["model", "messages", "stream", "temperature", "stream_options"]


def test_a_lone_surrogate_goes_back_as_the_bytes_it_came_in():
    raw = b'{"model": "m", "messages": "' + b"x" * SPAN_BYTES + b'\xed\xa0\x80"}'  # accepted by json.loads
    parsed = parse_json(raw)
    assert parsed.value == json.loads(raw)
    assert b'"messages":"' + b"x" * SPAN_BYTES + b'\xed\xa0\x80"' in dumps_with(parsed.value, {"model": "p"},
                                                                               parsed.spans)


def test_the_last_of_a_repeated_key_counts_as_in_json_loads():
    raw = big('{"model": "a", "messages": [1], "model": "b", "messages": [2, 3]}')
    parsed = parse_json(raw)
    assert parsed.value == json.loads(raw) == {"model": "b", "messages": [2, 3]}
    assert json.loads(dumps_with(parsed.value, {"stream": True}, parsed.spans)) == {"model": "b", "messages": [2, 3],
                                                                                   "stream": True}


@pytest.mark.parametrize("raw", [big("{}"), big(" { } "), big('{"a": {"b": [1, 2.5e3, null, false]}, "c": "d"}'),
                                 "\ufeff".encode() + big('{"a": 1}')])
def test_any_object_parses_as_in_json_loads(raw):
    parsed = loads(raw, json.JSONDecoder())
    assert parsed.value == json.loads(raw)
    assert parsed.spans is not None
    assert json.loads(dumps_with(parsed.value, {"model": "p"}, parsed.spans)) == {**json.loads(raw), "model": "p"}


def test_small_bodies_and_bodies_of_many_keys_are_parsed_whole():
    assert loads(b'{"a": 1}', json.JSONDecoder()).spans is None
    many = big(json.dumps({f"k{i}": i for i in range(MAX_SPANS + 1)}))
    parsed = loads(many, json.JSONDecoder())
    assert parsed.spans is None
    assert parsed.value == json.loads(many)
    assert json.loads(dumps_with(parsed.value, {"k0": "x"}, parsed.spans)) == {**json.loads(many), "k0": "x"}


@pytest.mark.parametrize("text", ['{"a": 1 "b": 2}', '{"a": 1,}', '{"a" 1}', "{a: 1}", '{"a": }', '{"a": 1} x',
                                  '{"a": [1, 2}', '{"a": "x', "{", '{"a": 1', "[1, 2]", '"x"', "", '{"a": "\x01"}'])
def test_bad_bodies_fail_as_json_loads_fails(text):
    raw = big(text)
    try:
        expected = json.loads(raw)
    except json.JSONDecodeError as exc:
        with pytest.raises(json.JSONDecodeError) as info:
            loads(raw, json.JSONDecoder())
        assert (info.value.msg, info.value.pos) == (exc.msg, exc.pos)
    else:
        assert loads(raw, json.JSONDecoder()).value == expected


@pytest.mark.parametrize("raw,fragment", [
    (big('{"model": "m", "messages": [1, 2}'), "not valid JSON: Expecting ',' delimiter at line 1 column 33"),
    (big('{"a": 1, "temperature": NaN}'), "NaN"),
    (big("[1, 2]"), "must be a JSON object"),
    (b"\xff" * SPAN_BYTES, "not valid UTF-8"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested too deeply"),
])
def test_a_large_bad_body_is_a_400_that_says_why(raw, fragment):
    with pytest.raises(InvalidRequest) as info:
        parse_json_body(raw)
    assert fragment in info.value.message


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "messages": [{"role": "user", "content": "caf\\u00e9 \xe6\x9d\xb1"}], "temperature": 0.7}',
    b'{"model": "m", "seed": 123456789012345678901234567890}',  # past 64 bits: the standard library writes it
    b'{"model": "m", "messages": "half \\ud800 a pair"}',  # a lone surrogate: the standard library writes it
    b'{"model": "m", "n": 1e-7, "top_p": 1e16, "nested": {"a": [true, null, -0.0]}}',
])
def test_a_small_body_is_sent_on_compact_and_equal_to_the_clients_but_its_change(raw):
    parsed = parse_json(raw)
    assert parsed.spans is None  # small: serialised again
    sent = dumps_with(parsed.value, {"model": "pool-model"}, parsed.spans)
    assert json.loads(sent) == {**json.loads(raw), "model": "pool-model"}
    assert b", " not in sent and b": " not in sent
    assert list(json.loads(sent)) == list(json.loads(raw))  # its keys in the client's order


def _typed(value):
    """`value` with the type of every number in it: 1 and 1.0 are equal, but json.loads tells them apart."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("raw", [
    b'{"a": 1, "b": 1.0, "c": -0, "d": -0.0, "e": 1E5, "f": 5e-324, "g": 1.7976931348623157e308, "h": 1e400}',
    b'{"big": 123456789012345678901234567890, "low": -9223372036854775809, "high": 18446744073709551616}',
    b'{"edge": -9223372036854775808, "top": 9223372036854775807, "n": 0.30000000000000004}',
    b'{"a": "caf\\u00e9 \\ud83d\\ude00 \xe6\x9d\xb1", "b": "half \\ud800 a pair", "a": "last"}',
    b'{"raw surrogate": "\xed\xa0\x80"}', b"\xef\xbb\xbf{}", '{"utf": 16}'.encode("utf-16"),
    b'{"deep": ' + b"[" * 300 + b"]" * 300 + b"}", b'  {"tools": [{"a": {}}, {"b": []}]}\n',
])
def test_a_small_body_parses_exactly_as_in_json_loads(raw):
    """orjson reads most small bodies: its value is json.loads's, to the type of every number."""
    parsed = loads(raw, json.JSONDecoder())
    assert parsed.spans is None
    assert _typed(parsed.value) == _typed(json.loads(raw))


@pytest.mark.parametrize("raw,fragment", [
    (b'{"a": 1, "temperature": NaN}', "NaN"), (b'{"a": Infinity}', "Infinity"),
    (b'{"a": 1,}', "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 9"),
    (b'{"a": 1} x', "not valid JSON: Extra data at line 1 column 10"),
    (b"\xff{}", "not valid UTF-8"), (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
    (b'{"a": ' + b"[" * 1020 + b"]" * 1020 + b"}", "nested too deeply"),  # orjson would read it: json.loads not
])
def test_a_small_bad_body_is_the_400_json_loads_would_give(raw, fragment):
    with pytest.raises(InvalidRequest) as info:
        parse_json_body(raw)
    assert fragment in info.value.message


def _nested(levels: int, inner: object = 0) -> object:
    value = inner
    for level in range(levels - 1):
        value = [value] if level % 2 else {"k": value}
    return [value]


@pytest.mark.parametrize("value, read", [
    (_nested(ORJSON_DEPTH), True), (_nested(ORJSON_DEPTH + 1), False), (_nested(ORJSON_DEPTH, {}), False),
    (_nested(40, INTEGER_AS_FLOAT), False), (_nested(40, -INTEGER_AS_FLOAT), False),
    (_nested(40, 9.223372036854775e18), True), ({"a": [1.5, -2e300]}, False), ({"a": "1" * 40}, True),
    (1e19, False), (-1e19, False), (0.5, True), ("text", True), (None, True), (10**30, True), ([], True), ({}, True),
])
def test_what_orjson_read_is_json_loads_value_within_its_depth_and_below_2_to_the_63(value, read):
    """An integer past 64 bits comes out of orjson as a float of 2**63 or more: such a float, or
    nesting past what orjson writes, sends the body to the decoder."""
    assert read_as_json_loads(value) is read


_DIGITS = st.text("0123456789", min_size=1, max_size=45)
_NUMBERS = st.builds(
    lambda sign, whole, fraction, exponent: f"{sign}{whole.lstrip('0') or '0'}{fraction}{exponent}",
    st.sampled_from(["", "-"]), _DIGITS, st.one_of(st.just(""), _DIGITS.map(lambda d: "." + d)),
    st.one_of(st.just(""), st.integers(-340, 340).map(lambda e: f"e{e}")))


@given(st.lists(_NUMBERS, min_size=1, max_size=8), st.integers(1, 4))
def test_every_number_a_small_body_holds_is_read_as_json_loads_reads_it(numbers, levels):
    """Integers and floats of any length and exponent, at any depth, typed as json.loads types
    them: integers past 64 bits and floats past a double's digits included."""
    raw = ('{"n": ' + "[" * levels + ", ".join(numbers) + "]" * levels + "}").encode()
    parsed = loads(raw, json.JSONDecoder())
    assert _typed(parsed.value) == _typed(json.loads(raw))
