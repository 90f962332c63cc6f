"""The four endpoints that reach the decision and their paths (gateway/decide/apis.py reads their bodies).

A module of its own, with no imports: the command line's parser lists the endpoints
(`explain --endpoint`) before `specgate serve` loads the compiled build, and a module
imported by then cannot be served compiled (specgate/compiled.py).
"""

from __future__ import annotations

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
         "messages": "/v1/messages", "responses": "/v1/responses"}
ENDPOINTS = tuple(PATHS)


def endpoint_of(path: str) -> str | None:
    """The endpoint a request path names, or None for any other path."""
    for endpoint, known in PATHS.items():
        if path == known:
            return endpoint
    return None
