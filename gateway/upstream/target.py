"""`Target`: where one request goes, its URL and what the wire needs of it, read off once.

An endpoint keeps the targets of the paths it serves (`Endpoint.target_for`), so a
request's origin (the pool of connections it may use), request-target and Host
header are read off its URL once for all the requests to that path: each is an
interpreted property of `httpx.URL`, six calls a request.
"""

from __future__ import annotations

import httpx

Origin = tuple[bytes, bytes, int]  # scheme, host, port: the connections a request may share


class Target:
    def __init__(self, url: httpx.URL) -> None:
        self.url = url
        self.origin: Origin = (url.raw_scheme, url.raw_host, url.port or (443 if url.scheme == "https" else 80))
        self.path = url.raw_path or b"/"  # path and query, as the request line carries them
        self.host = url.netloc  # the Host header's value
