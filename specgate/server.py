"""The server `specgate serve` runs the gateway on (one process, or each worker).

It is uvicorn's, with one change: once the app has started (the policy
loaded, its tables, pools and routes built, the port bound), the objects the
start made are collected once and frozen (`gc.freeze`), out of the cyclic
collector's reach. Otherwise each full collection walks them all again:
about 85,000 objects, 35-45 ms with the event loop stopped, and under load it
ran every half second, because a request's objects outlive the young
generations while it is in flight and are promoted to the old one; every
request in flight then waited for it, which was the gateway's p99 at 32
connections. Frozen, a full collection walks only what was made since.

The young generation's threshold is raised too, from 700 to 10,000 (net
new container objects between passes). At 700 it ran about 220 passes a
second under load, each walking the in-flight requests' objects only to find
them alive (2.5% of the process's time); a request leaves next to no
reference cycles behind, so at 10,000 there was no pass at all in 30,000
requests, and the garbage a pass would find is bounded by the threshold.

What is frozen is still freed when nothing refers to it; only a reference
cycle among frozen objects is never collected. The start's objects live as
long as the process, but for the first policy once a reload replaces it: its
cycles, if any, stay (once; a reloaded policy is built after the freeze and
collected as usual: 300 reloads grew the process as much frozen as not).
"""

from __future__ import annotations

import gc
import socket

import uvicorn

YOUNG_THRESHOLD = 10_000  # net new container objects between young passes (CPython's default: 700)


def tune_collector() -> None:
    """Once the app has started: the start's garbage collected, what is left frozen, the young threshold raised."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class GatewayServer(uvicorn.Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:  # not after a failed start: the server is about to exit
            tune_collector()
