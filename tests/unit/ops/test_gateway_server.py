"""The server `specgate serve` runs: what the app made to start is frozen out
of the cyclic collector's walks once it has started, and the young
generation's threshold raised; neither after a failed start. In a process of
its own: a freeze and the thresholds are the whole process's."""

from __future__ import annotations

import json
import subprocess
import sys

SERVE = """
import asyncio, gc, json, sys, uvicorn
from specgate.server import GatewayServer
seen = {}

async def app(scope, receive, send):
    assert scope["type"] == "lifespan"
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            seen["at_startup"] = gc.get_freeze_count()
            kept = [[n] for n in range(5000)]  # built to start, as a policy's tables are
            seen["kept"] = kept
            await send({"type": "lifespan.startup." + sys.argv[1]})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

async def main():
    server = GatewayServer(uvicorn.Config(app, port=0, lifespan="on", log_level="critical"))
    serving = asyncio.create_task(server.serve())
    while not (server.started or serving.done()):
        await asyncio.sleep(0.01)
    seen["serving"] = gc.get_freeze_count()
    seen["threshold"] = gc.get_threshold()
    table = seen["kept"][0]
    seen["tables_frozen"] = not any(o is table for g in (0, 1, 2) for o in gc.get_objects(generation=g))
    server.should_exit = True
    await serving
    seen["started"] = server.started
    print(json.dumps({k: v for k, v in seen.items() if k != "kept"}))

try:
    asyncio.run(main())
except SystemExit as exc:  # uvicorn's own exit on a failed start, raised out of the loop
    print(json.dumps({"exit": exc.code, "frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}))
"""


def serve(outcome: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SERVE, outcome], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_what_the_start_made_is_frozen_once_serving():
    seen = serve("complete")
    assert seen["started"] is True
    assert seen["at_startup"] == 0
    assert seen["serving"] >= 5000  # the start's objects, the app's tables among them
    assert seen["tables_frozen"] is True
    assert seen["threshold"] == [10_000, 10, 10]  # the young generation's raised; the older two CPython's


def test_nothing_is_frozen_after_a_failed_start():
    assert serve("failed") == {"exit": 3, "frozen": 0, "threshold": [700, 10, 10]}
