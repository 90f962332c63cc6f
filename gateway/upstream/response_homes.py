"""Where each Responses answer lives, so its follow-ups reach it.

A backend keeps the Responses it answered (vLLM in memory), and a request
with `previous_response_id` can only be served by the replica that holds
that response. The gateway notes, for each answer that completed, its id
and the pool and endpoint that served it; a follow-up goes there and
nowhere else (gateway/edge/endpoints.py). The map is an LRU bounded by
count: an id that fell out of it, or that this gateway never saw, is routed
like any other request, and the backend answers whether it holds it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

DEFAULT_SIZE = 100_000  # about 20 MB of ids and names at most


class Home(NamedTuple):
    pool: str
    endpoint: str  # the endpoint's URL


class ResponseHomes:
    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._homes: OrderedDict[str, Home] = OrderedDict()

    def remember(self, response_id: str, pool: str, endpoint: str) -> None:
        self._homes[response_id] = Home(pool, endpoint)
        self._homes.move_to_end(response_id)
        while len(self._homes) > self.size:
            self._homes.popitem(last=False)

    def find(self, response_id: str) -> Home | None:
        home = self._homes.get(response_id)
        if home is not None:
            self._homes.move_to_end(response_id)
        return home

    def __len__(self) -> int:
        return len(self._homes)
