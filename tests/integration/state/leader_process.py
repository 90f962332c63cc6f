"""One process taking part in the guard's election on a shared Redis, for tests.

It runs the lease loop and the followers' loop of the gateway and, while it
leads, a stand-in for the guard's check: ask for the fencing token, spend
`--check-s` reading signals, write a verdict under that token. Every event is
one JSON line on stdout: leading, following, checking, written, refused.

    python -m tests.integration.state.leader_process URL NAME [--ttl-s ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from gateway.control.leader import Leader
from gateway.control.verdicts import SharedVerdicts
from gateway.flags import FlagStore, PoolFlag
from gateway.load import LoadReport
from gateway.state.store import StateStore


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


async def lead(args: argparse.Namespace) -> None:
    store = StateStore(args.url, namespace="procs", timeout_s=0.5)
    verdicts = SharedVerdicts(store, lambda take_over: Leader(
        store, ttl_s=args.ttl_s, renew_s=args.renew_s, holder=args.name, before_leading=take_over,
        on_change=lambda leading: emit("leading" if leading else "following", token=leader.token),
    ), FlagStore(["spec"]), LoadReport(), read_s=args.renew_s)
    leader = verdicts.leader
    verdicts.start()
    try:
        while True:
            token = leader.lead()
            if token is not None:
                emit("checking", token=token)
                await asyncio.sleep(args.check_s)  # reading the signals
                verdict = {"spec": PoolFlag(guard_enabled=False, reason=f"low_acceptance: judged by {args.name}")}
                written = await verdicts.publish(token, verdict, {})
                emit("written" if written else "refused", token=token)
            await asyncio.sleep(args.interval_s)
    finally:
        await verdicts.aclose()
        await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("name")
    parser.add_argument("--ttl-s", type=float, default=1.0)
    parser.add_argument("--renew-s", type=float, default=0.25)
    parser.add_argument("--interval-s", type=float, default=0.25)
    parser.add_argument("--check-s", type=float, default=0.05)
    asyncio.run(lead(parser.parse_args()))


if __name__ == "__main__":
    main()
