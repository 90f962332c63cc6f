"""A request's JSON body, parsed once, with where each top-level value lies in
its text (`Spans`), so that the body can be sent on with a few top-level
fields changed (a pool's `model`, the usage a stream asks for) by copying the
other values' text instead of serialising them again.

Serialising an 8 MB prompt again takes about 65 ms, and the C encoder holds
the GIL all that time: in a worker thread it stalls the event loop just the
same. Joining the copied text takes about 1 ms (an ASCII body's values are
sliced from its bytes without a copy).

`loads` walks the top-level object of a body of `SPAN_BYTES` or more itself
and lets the C scanner parse each value, so it costs what `json.loads`
costs. Anything the walk does not take (a value that is not an object, more
than `MAX_SPANS` keys, any syntax error) is handed to the decoder whole: the
value, the error and its message are then exactly `json.loads`'s.

A smaller body, every request but the rare large one, is parsed by orjson,
about three times as fast as the standard library's decoder, whenever
orjson gives what `json.loads` gives. It refuses what json.loads reads
differently or not at all (NaN and Infinity, a lone surrogate, text in
UTF-16, a byte-order mark, an invalid byte), and the body then goes to the
decoder, whose value, error and message stand. Two kinds of value that orjson
reads go to the decoder too, found by one walk of what it read (its values, not
its bytes: a 4 KB prompt is one value, and its bytes scanned twice and copied
once cost four times orjson's parse):
- a float of magnitude 2**63 or more: it may have been an integer past 64
  bits, which orjson reads as a float (json.loads as an int);
- more than `ORJSON_DEPTH` levels: it may nest deeper than json.loads reads
  (orjson reads 1,024 levels, json.loads as deep as the stack lets it) or
  than orjson writes it again (`dumps_with`).
Every other number orjson reads as json.loads does, to the last bit of a
float with more digits than a double holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]  # the C scanner; typeshed omits it
from typing import Any

import orjson

SPAN_BYTES = 64 * 1024  # a smaller body is parsed by the decoder alone: serialising it again costs under 0.5 ms
MAX_SPANS = 256  # top-level keys walked in Python; past them the decoder parses the body whole, without spans
SEPARATORS = (",", ":")
_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace, as json.decoder reads it
ORJSON_DEPTH = 254  # the levels orjson writes
INTEGER_AS_FLOAT = 2.0 ** 63  # an integer past 64 bits comes out of orjson as a float at least this large


@dataclass(frozen=True, slots=True)
class Spans:
    """The body and, for each top-level key, where its value (the last one, as
    `json.loads` keeps it) begins and ends in its text. `text` is None when
    every character is one byte (ASCII in UTF-8): positions are then
    positions in `raw`, and the decoded text is not kept."""
    raw: bytes
    text: str | None
    at: Mapping[str, tuple[int, int]]


class JsonBody:
    """A parsed body (a plain class, built per request: mypyc compiles its `__init__`)."""

    def __init__(self, value: Any, spans: Spans | None) -> None:
        self.value = value  # what json.loads gives
        self.spans = spans  # None for a small body, or unless the value is an object the walk took


def loads(raw: bytes, decoder: json.JSONDecoder) -> JsonBody:
    """`json.loads(raw)` with `decoder`'s options, and the spans of its top level.
    Raises what json.loads raises (UnicodeDecodeError, JSONDecodeError, ...).
    Of the options only `parse_constant` may differ from the defaults: orjson
    reads a small body without them, and refuses the constants it is called on."""
    small = len(raw) < SPAN_BYTES
    if small:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # the decoder reads it as json.loads does, or raises what json.loads raises
        else:
            if read_as_json_loads(value):
                return JsonBody(value, None)
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads decodes bytes
    if small:
        return JsonBody(decoder.decode(text), None)
    try:
        value, at = _walk(text, decoder)
    except (ValueError, StopIteration):
        return JsonBody(decoder.decode(text), None)
    return JsonBody(value, Spans(raw, None if len(raw) == len(text) else text, at))


def read_as_json_loads(value: object) -> bool:
    """Whether `value`, as orjson read it, is what json.loads reads: nested at most
    `ORJSON_DEPTH` levels, and no float that may have been an integer past 64 bits.
    One level at a time, so no recursion however deep orjson went."""
    if isinstance(value, float):
        return -INTEGER_AS_FLOAT < value < INTEGER_AS_FLOAT
    level: list[dict[Any, Any] | list[Any]] = [value] if isinstance(value, (dict, list)) else []
    depth = 1
    while level:
        if depth > ORJSON_DEPTH:
            return False
        deeper: list[dict[Any, Any] | list[Any]] = []
        for container in level:
            for item in container.values() if isinstance(container, dict) else container:
                if isinstance(item, float):
                    if not -INTEGER_AS_FLOAT < item < INTEGER_AS_FLOAT:
                        return False
                elif isinstance(item, (dict, list)):
                    deeper.append(item)
        level, depth = deeper, depth + 1
    return True


def dumps_with(body: Mapping[str, Any], changes: Mapping[str, Any], spans: Spans | None) -> bytes:
    """`{**body, **changes}` as JSON: the values `changes` leaves as they were
    copied from `spans` (the text `body` was parsed from) when given."""
    merged = {**body, **changes}
    if spans is None:
        try:  # orjson: what the standard library writes, but text outside ASCII is UTF-8, not escaped
            return orjson.dumps(merged)
        except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, a lone surrogate
            return json.dumps(merged, separators=SEPARATORS).encode()
    # Joined once: each `+` on a large value would copy it again. An ASCII body's
    # characters are its bytes: its values are sliced from the bytes without a copy.
    source: memoryview | str = memoryview(spans.raw) if spans.text is None else spans.text
    parts: list[Any] = []
    for key, value in merged.items():
        where = None if key in changes else spans.at.get(key)
        if where is None:
            parts += (",", json.dumps(key), ":", json.dumps(value, separators=SEPARATORS))
        else:
            parts += (",", json.dumps(key), ":", source[where[0]:where[1]])
    parts[:1] = ["{"]  # for the first comma; the brace alone when there is no key
    parts.append("}")
    if spans.text is None:
        return b"".join(p.encode() if isinstance(p, str) else p for p in parts)
    # a lone surrogate the client sent as UTF-8 bytes goes back as those bytes
    return "".join(parts).encode("utf-8", "surrogatepass")


def _walk(text: str, decoder: json.JSONDecoder) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """The top-level object and its values' spans; ValueError (or the scanner's
    StopIteration) for anything else, left to the decoder to parse or to explain."""
    end = _skip(text, 0)
    if text[end:end + 1] != "{":
        raise ValueError("not an object")
    value: dict[str, Any] = {}
    at: dict[str, tuple[int, int]] = {}
    end = _skip(text, end + 1)
    closing = text[end:end + 1] == "}"
    if closing:
        end = _skip(text, end + 1)
    while not closing:
        if text[end:end + 1] != '"' or len(at) >= MAX_SPANS:
            raise ValueError("no key here, or too many keys to walk")
        key, end = scanstring(text, end + 1, decoder.strict)
        end = _skip(text, end)
        if text[end:end + 1] != ":":
            raise ValueError("no colon")
        start = _skip(text, end + 1)
        value[key], end = decoder.scan_once(text, start)  # type: ignore[attr-defined]  # set by JSONDecoder
        at[key] = (start, end)
        end = _skip(text, end)
        closing = text[end:end + 1] == "}"
        if not closing and text[end:end + 1] != ",":
            raise ValueError("no comma")
        end = _skip(text, end + 1)
    if end != len(text):
        raise ValueError("extra data")
    return value, at


def _skip(text: str, at: int) -> int:
    """The first index from `at` on that is not JSON whitespace."""
    found = _SPACE.match(text, at)
    return at if found is None else found.end()
