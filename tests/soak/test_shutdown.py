"""Graceful shutdown: on SIGTERM the gateway process stops accepting
connections, lets the streams in flight finish (up to
SPECGATE_DRAIN_TIMEOUT_S), then exits and says so in its log."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.vllm import FakeVllm
from tests.soak.gateway_process import GatewayProcess, one_pool_policy

pytestmark = [pytest.mark.soak, pytest.mark.timeout(120)]

STREAMS = 6
CHUNKS, CHUNK_DELAY_S = 12, 0.25  # 3 s per stream


@pytest.fixture
def slow_fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="fake-model", kind="standard") as fake:
        fake.script(text=" ".join(f"w{i}" for i in range(CHUNKS)), chunks=CHUNKS, delay=CHUNK_DELAY_S)
        yield fake


def start_gateway(tmp_path: Path, fake: FakeVllm, drain_timeout_s: float) -> GatewayProcess:
    pool = {"endpoints": [{"url": fake.url}], "timeouts": {"connect_s": 1, "first_byte_s": 5, "total_s": 30}}
    env = {"SPECGATE_DRAIN_TIMEOUT_S": str(drain_timeout_s)}
    return GatewayProcess(one_pool_policy(tmp_path, pool), tmp_path / "gateway.log", env=env).start()


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except ConnectionRefusedError:
        return True


async def stream_during_sigterm(gateway: GatewayProcess) -> tuple[list[bytes], float | None, int]:
    """Open the streams, send SIGTERM once each has its first chunk; the bodies,
    when new connections were first refused (seconds after the signal), and
    how many streams were still open at that moment."""
    first_chunk = [asyncio.Event() for _ in range(STREAMS)]
    done: list[bool] = [False] * STREAMS
    body = {"model": "fake-model", "stream": True, "max_tokens": 64,
            "messages": [{"role": "user", "content": "Tell me about rivers."}]}

    async def one(client: httpx.AsyncClient, index: int) -> bytes:
        received = b""
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for chunk in response.aiter_raw():
                received += chunk
                if b"data: {" in received:
                    first_chunk[index].set()
        done[index] = True
        return received

    async with httpx.AsyncClient(base_url=gateway.url, timeout=30.0,
                                 limits=httpx.Limits(max_connections=STREAMS)) as client:
        tasks = [asyncio.create_task(one(client, i)) for i in range(STREAMS)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first_chunk)), 10)
        os.kill(gateway.pid, signal.SIGTERM)
        signalled = time.monotonic()
        refused_after = None
        open_when_refused = 0
        while time.monotonic() - signalled < 2.0:
            if await asyncio.to_thread(refuses_connections, gateway.port):
                refused_after = time.monotonic() - signalled
                open_when_refused = done.count(False)
                break
            await asyncio.sleep(0.05)
        bodies = await asyncio.gather(*tasks, return_exceptions=True)
    return bodies, refused_after, open_when_refused


def test_sigterm_drains_streams_in_flight_then_exits(tmp_path, slow_fake):
    gateway = start_gateway(tmp_path, slow_fake, drain_timeout_s=20)
    try:
        bodies, refused_after, open_when_refused = asyncio.run(stream_during_sigterm(gateway))
        exit_status = gateway.process.wait(15)
    finally:
        gateway.stop()
    for body in bodies:
        assert isinstance(body, bytes), body
        assert body.rstrip().endswith(b"data: [DONE]")
        text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                       for line in body.decode().splitlines()
                       if line.startswith("data: {"))
        assert text == " ".join(f"w{i}" for i in range(CHUNKS))
    assert refused_after is not None and open_when_refused > 0  # closed while streams still ran
    assert exit_status in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after a clean shutdown
    log = gateway.log()
    assert "stopped" in [json.loads(line).get("event") for line in log.splitlines() if line.startswith("{")]
    assert "timeout graceful shutdown exceeded" not in log and "Traceback" not in log


def test_streams_longer_than_the_drain_timeout_do_not_hold_the_exit(tmp_path, slow_fake):
    slow_fake.script(delay=2.0)  # 24 s per stream, far over the 1 s drain
    gateway = start_gateway(tmp_path, slow_fake, drain_timeout_s=1)
    try:
        async def open_streams_then_terminate() -> int:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30.0) as client:
                body = {"model": "fake-model", "stream": True, "prompt": "x", "max_tokens": 64}
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    os.kill(gateway.pid, signal.SIGTERM)
                    # the stream has 22 s to go: exiting now is the drain timeout at work
                    return await asyncio.to_thread(gateway.process.wait, 15)

        exit_status = asyncio.run(open_streams_then_terminate())
    finally:
        gateway.stop()
    assert exit_status in (0, -signal.SIGTERM)
    assert "timeout graceful shutdown exceeded" in gateway.log()


def test_a_drain_timeout_under_a_second_still_drains(tmp_path, slow_fake):
    slow_fake.script(chunks=4, delay=0.1)
    gateway = start_gateway(tmp_path, slow_fake, drain_timeout_s=0.8)
    try:
        async def stream_through_sigterm() -> bytes:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30.0) as client:
                body = {"model": "fake-model", "stream": True, "prompt": "x", "max_tokens": 64}
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    chunks = response.aiter_raw()
                    received = await anext(chunks)
                    os.kill(gateway.pid, signal.SIGTERM)  # about 0.3 s of the stream left
                    async for chunk in chunks:
                        received += chunk
                    return received

        received = asyncio.run(stream_through_sigterm())
    finally:
        gateway.stop()
    assert received.rstrip().endswith(b"data: [DONE]")
