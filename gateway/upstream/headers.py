"""The headers a request and its answer carry across the gateway.

Hop-by-hop headers (RFC 9110, section 7.6.1), those a message's `Connection`
names and the gateway's own routing headers (`x-specgate-*`) stop here; what
the gateway sets itself replaces the backend's. A request header the
gateway cannot send on unchanged is refused with a 400, never dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gateway.errors import InvalidRequest
from gateway.upstream.answer import AnswerHeaders

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})
# `Expect` is answered by the gateway's own server (100-continue) and never sent on.
REQUEST_DROP = HOP_BY_HOP | {"expect"}
# Also dropped from responses: the gateway's own server sets these.
RESPONSE_DROP = HOP_BY_HOP | {"date", "server"}
# What an HTTP/1.1 header value may carry on its way upstream: tab and visible ASCII.
UNSENDABLE = re.compile(r"[^\t\x20-\x7e]")


def connection_named(values: Iterable[str]) -> set[str]:
    """The header names a message's `Connection` headers list: hop-by-hop for
    that message as well (RFC 9110, section 7.6.1)."""
    return {token.strip().lower() for value in values for token in value.split(",") if token.strip()}


def request_headers(headers: Iterable[tuple[str, str]], extra: dict[str, str]) -> list[tuple[str, str]]:
    """Headers for the backend: the client's, less hop-by-hop and routing ones, plus `extra`.

    A header value with a byte >= 0x80 or a control character is refused (400
    naming the header), not dropped: dropping would send on a request other
    than the one the client made (an authorization, idempotency or tracing
    header gone without a word) and hide the client's bug.
    """
    headers = list(headers)
    named = connection_named(v for k, v in headers if k.lower() == "connection")
    kept = []
    for key, value in headers:
        name = key.lower()
        if name in REQUEST_DROP or name in extra or name in named or name.startswith("x-specgate-"):
            continue
        # two C calls settle nearly every value; the pattern only those they do not
        if not (value.isascii() and value.isprintable()) and UNSENDABLE.search(value):
            raise InvalidRequest(f"header '{name}' holds a byte that cannot be forwarded "
                                 "(non-ASCII or a control character)", param=name)
        kept.append((key, value))
    return kept + list(extra.items())


def response_headers(headers: AnswerHeaders, extra: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The backend's headers less hop-by-hop ones (those its `Connection` names
    too) and less those the gateway sets itself: `extra` replaces them."""
    lowered = [(k.lower(), v) for k, v in headers.raw]  # each name lowered once: a method call from compiled code
    named = connection_named([v.decode("latin-1") for k, v in lowered if k == b"connection"])
    kept = [(k, v) for k, v in lowered
            if (name := k.decode("latin-1")) not in RESPONSE_DROP and name not in extra and name not in named]
    return kept + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
