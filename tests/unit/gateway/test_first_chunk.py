"""A stream's first chunk is awaited under one timer: late, it is a TimeoutError (the
relay answers it with an error event); the client leaving meanwhile stays a
cancellation; a chunk in time leaves no timer behind to cancel the relay later."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.upstream.relay import Relay, RelayTimeouts

SOON_S = 0.01


async def never() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()
    yield b"unreachable"


async def at_once() -> AsyncIterator[bytes]:
    yield b"data: {}\n\n"


async def sent(_: Any) -> None:
    return None


def here() -> tuple[asyncio.Task[Any] | None, asyncio.AbstractEventLoop]:
    """The task and loop the relay hands its timers: the one running."""
    loop = asyncio.get_running_loop()
    return asyncio.current_task(loop), loop


def relay(first_chunk_s: float = SOON_S) -> Relay:
    timeouts = RelayTimeouts(first_chunk_s=first_chunk_s, keepalive_s=60.0, write_s=60.0)
    return Relay(exchange=None, timeouts=timeouts)  # type: ignore[arg-type]  # the first chunk needs no exchange


def test_no_first_chunk_in_time_is_a_timeout() -> None:
    async def run() -> None:
        with pytest.raises(TimeoutError):
            await relay()._first_chunk(never(), sent, *here())
        assert asyncio.current_task().cancelling() == 0  # the cancellation it used is gone

    asyncio.run(run())


def test_a_first_chunk_in_time_leaves_no_timer_behind() -> None:
    async def run() -> bytes:
        chunk = await relay()._first_chunk(at_once(), sent, *here())
        await asyncio.sleep(SOON_S * 5)  # past the bound: a timer left armed would cancel this task
        return chunk

    assert asyncio.run(run()) == b"data: {}\n\n"


def test_the_client_leaving_while_it_waits_stays_a_cancellation() -> None:
    async def run() -> None:
        async def first() -> bytes:  # its timers for the task it runs in
            return await relay(first_chunk_s=60.0)._first_chunk(never(), sent, *here())

        waiting = asyncio.ensure_future(first())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(run())
