"""The request target, checked and normalised once at the edge, before routing.

Everything after the edge (the routes, and the passthrough that forwards any
other `/v1/*` path to a backend with the pool's key) sees only a path that is
plain `/`-separated segments: no dot segment can climb out of `/v1`, and no
encoded slash, backslash or dot can become one further down the line. The
source is the raw path as it came on the wire (`scope["raw_path"]`); the
server's decoded `scope["path"]` has already lost the difference between `/`
and `%2F`.

Rules (RFC 3986 section 6.2.2 normalisation, stricter where a proxy must be):
- at most `MAX_TARGET_BYTES` of path and query together;
- the path begins with `/` and holds only characters RFC 3986 allows in one
  (no control characters, spaces, backslashes or raw non-ASCII bytes);
- `%2F`, `%5C`, `%2E` and `%25` (any case) are refused: decoded here and
  encoded again on the way to the backend, they would mean something else
  there; encoded control characters are refused too;
- encoded unreserved characters are decoded, other escapes upper-cased, and
  the decoded path must be UTF-8;
- `.` and `..` segments are refused rather than resolved: a client of an
  API has no reason to send them, and refusing leaves nothing to resolve;
- empty segments are dropped (`//v1//chat/completions/` is
  `/v1/chat/completions`): a path that differs from a route only in its
  slashes is that route, never a passthrough that skips its routing;
- the query holds no control characters and no raw non-ASCII bytes.
"""

from __future__ import annotations

import re
import string
from typing import ClassVar
from urllib.parse import unquote_to_bytes

from gateway.errors import InvalidRequest

MAX_TARGET_BYTES = 8 * 1024

_UNRESERVED = frozenset((string.ascii_letters + string.digits + "-._~").encode())
_PATH_CHARS = _UNRESERVED | frozenset(b"!$&'()*+,;=:@/")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DOT_SEGMENTS = (bytearray(b"."), bytearray(b".."))  # what a bytearray path splits into
# Segments of unreserved characters, none starting with '.': nothing to check further.
_PLAIN_PATH = re.compile(rb"(?:/(?:[A-Za-z0-9_~-][A-Za-z0-9._~-]*)?)+")
_BAD_QUERY_BYTE = re.compile(rb"[\x00-\x1f\x7f-\xff]")
_REFUSED_ESCAPES = {0x2F: "an encoded '/'", 0x5C: "an encoded '\\'", 0x2E: "an encoded '.'",
                    0x25: "an encoded '%'"}


def normalise_target(raw_path: bytes, query: bytes = b"") -> tuple[bytes, str]:
    """The normalised raw path and its decoded form, or InvalidRequest (400)."""
    if len(raw_path) + len(query) > MAX_TARGET_BYTES:
        raise _invalid(f"the request target is over the {MAX_TARGET_BYTES} byte limit", "target_too_long")
    if _BAD_QUERY_BYTE.search(query):
        raise _invalid("the query string contains a control character or a raw non-ASCII byte")
    if _PLAIN_PATH.fullmatch(raw_path):
        plain = _collapse(raw_path)
        return plain, plain.decode("ascii")
    if not raw_path.startswith(b"/"):
        raise _invalid("the request path must begin with '/'")
    out = bytearray()
    i = 0
    while i < len(raw_path):
        byte = raw_path[i]
        if byte == 0x25:  # '%'
            pair = raw_path[i + 1 : i + 3]
            if len(pair) != 2 or not _HEX.issuperset(pair):
                raise _invalid("the request path has a malformed percent-encoding")
            value = int(pair, 16)
            if value in _REFUSED_ESCAPES:
                raise _invalid(f"the request path contains {_REFUSED_ESCAPES[value]}")
            if value < 0x20 or value == 0x7F:
                raise _invalid("the request path contains an encoded control character")
            out += bytes((value,)) if value in _UNRESERVED else b"%" + pair.upper()
            i += 3
        elif byte in _PATH_CHARS:
            out.append(byte)
            i += 1
        else:
            raise _invalid(f"the request path contains the byte 0x{byte:02x}, which a path may not hold raw")
    if any(segment in _DOT_SEGMENTS for segment in out.split(b"/")):
        raise _invalid("the request path contains a '.' or '..' segment")
    out = bytearray(_collapse(bytes(out)))
    try:
        decoded = unquote_to_bytes(bytes(out)).decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("the request path does not decode to UTF-8") from None
    return bytes(out), decoded


def _collapse(path: bytes) -> bytes:
    """The path without empty segments (doubled or trailing slashes)."""
    if b"//" not in path and (len(path) == 1 or not path.endswith(b"/")):
        return path
    return b"/" + b"/".join(segment for segment in path.split(b"/") if segment)


def _invalid(message: str, code: str = "invalid_path") -> InvalidRequest:
    return InvalidRequest(message, code=code)


class KnownTargets:
    """`normalise_target`, remembered for targets without a query: clients send the
    same few paths again and again. At most `size` are kept (the first valid ones seen
    of at most `KEPT_BYTES`: a client sending long paths cannot fill the memory with
    them); any other target is normalised each time it comes."""

    KEPT_BYTES: ClassVar[int] = 256  # ClassVar: compiled, a bare one would be an instance attribute

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._known: dict[bytes, tuple[bytes, str]] = {}

    def __call__(self, raw_path: bytes, query: bytes = b"") -> tuple[bytes, str]:
        if query:
            return normalise_target(raw_path, query)
        found = self._known.get(raw_path)
        if found is None:
            found = normalise_target(raw_path)  # a bad target raises here: never kept
            if len(self._known) < self.size and len(raw_path) <= self.KEPT_BYTES:
                self._known[raw_path] = found
        return found

    def __len__(self) -> int:
        return len(self._known)
