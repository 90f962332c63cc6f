"""A backend that resets new connections at once (a process dying under
load) must surface as an httpx transport error, which the proxy retries, on
the event loop the gateway runs on (uvloop, which raises on writes to a
closed transport), never as an unhandled error."""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter

import httpx
import pytest
import uvloop

from gateway.upstream.transport import PooledTransport

pytestmark = [pytest.mark.soak, pytest.mark.timeout(60)]

ATTEMPTS = 300  # the reset lands between connect and write in a few percent of them


def reset_every_connection(listener: socket.socket) -> None:
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:  # the listener closed: done
            return
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.close()


def test_a_connection_reset_before_the_request_is_written_is_a_transport_error():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    threading.Thread(target=reset_every_connection, args=(listener,), daemon=True).start()

    async def attempts() -> Counter[str]:
        transport = PooledTransport()
        seen: Counter[str] = Counter()
        timeouts = {"connect": 1.0, "read": 1.0, "write": 1.0, "pool": 1.0}
        for _ in range(ATTEMPTS):
            request = httpx.Request("POST", f"http://127.0.0.1:{port}/v1/completions", content=b"{}",
                                    extensions={"timeout": timeouts})
            try:
                await transport.handle_async_request(request)
                seen["answered"] += 1
            except httpx.TransportError:
                seen["transport_error"] += 1
            except Exception as exc:  # noqa: BLE001 - what must not happen
                seen[type(exc).__name__] += 1
        await transport.aclose()
        return seen

    try:
        seen = uvloop.run(attempts())
    finally:
        listener.close()
    assert seen == {"transport_error": ATTEMPTS}
