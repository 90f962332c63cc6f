"""SharedOverrides against a real redis-server: two replicas' flag stores in one loop."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import structlog

from gateway.flags import FlagStore, Mode
from gateway.state.overrides import SharedOverrides
from gateway.state.store import StateStore
from tests.fakes.redis_server import RedisServer

pytestmark = pytest.mark.slow  # a real redis-server per test

POOLS = ("speculative", "draft")


async def until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Wait for a state; fail after a generous hang guard."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


class Replica:
    def __init__(self, url: str, full_read_s: float = 0.5) -> None:
        self.flags = FlagStore(POOLS)
        self.store = StateStore(url, timeout_s=0.5)
        self.overrides = SharedOverrides(self.store, self.flags, full_read_s=full_read_s)

    async def start(self) -> Replica:
        self.store.start()
        await self.overrides.start(5.0)
        return self

    async def aclose(self) -> None:
        await self.overrides.aclose()
        await self.store.aclose()

    def mode(self, pool: str) -> Mode:
        return self.flags.snapshot()[pool].mode


def run(server: RedisServer, scenario: Callable[[], Awaitable[None]]) -> None:
    try:
        asyncio.run(scenario())
    finally:
        server.stop()


def test_an_override_reaches_the_other_replica_and_a_new_one_reads_it(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()

    async def scenario() -> None:
        a, b = await Replica(server.url).start(), await Replica(server.url).start()
        flag, shared = await a.overrides.set("speculative", Mode.FORCE_OFF, "admin:force_off")
        assert shared and flag.mode is Mode.FORCE_OFF
        await until(lambda: b.mode("speculative") is Mode.FORCE_OFF, "B applies A's override")
        assert b.flags.snapshot()["speculative"].reason == "admin:force_off"
        assert b.mode("draft") is Mode.AUTO
        late = await Replica(server.url).start()  # read before start() returns
        assert late.mode("speculative") is Mode.FORCE_OFF
        assert late.overrides.describe("speculative")["version"] == a.overrides.describe("speculative")["version"]
        for replica in (a, b, late):
            await replica.aclose()

    run(server, scenario)


def test_the_newest_version_wins_and_a_lost_message_is_caught_up(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()

    async def scenario() -> None:
        a, b = await Replica(server.url).start(), await Replica(server.url).start()
        await a.overrides.set("speculative", Mode.FORCE_OFF, "admin:force_off")
        await b.overrides.set("speculative", Mode.FORCE_ON, "admin:force_on")
        await until(lambda: a.mode("speculative") is Mode.FORCE_ON, "A takes B's newer override")
        # A write that announces nothing (as if the message were lost): the full read brings it.
        await a.store.client.hset(a.overrides.hash_key, "draft",
                                  b'{"pool": "draft", "mode": "force_off", "reason": "admin:force_off",'
                                  b' "written_at": "0", "version": 1000}')
        await until(lambda: b.mode("draft") is Mode.FORCE_OFF, "B reads the unannounced override")
        # An announced version older than the one applied is ignored.
        b.overrides._apply_raw(b'{"pool": "draft", "mode": "auto", "reason": "old", "written_at": "0",'
                               b' "version": 999}', stored=False)
        assert b.mode("draft") is Mode.FORCE_OFF
        await a.aclose()
        await b.aclose()

    run(server, scenario)


def test_down_keeps_the_last_modes_and_a_pending_override_is_written_on_return(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()

    async def scenario() -> None:
        a, b = await Replica(server.url).start(), await Replica(server.url).start()
        await a.overrides.set("speculative", Mode.FORCE_OFF, "admin:force_off")
        await until(lambda: b.mode("speculative") is Mode.FORCE_OFF, "B applies A's override")
        server.kill()
        await until(lambda: not a.store.up and not b.store.up, "both see the store down")
        flag, shared = await a.overrides.set("draft", Mode.FORCE_ON, "admin:force_on")
        assert not shared and flag.mode is Mode.FORCE_ON  # holds here at once
        assert a.overrides.describe("draft")["pending"]
        assert b.mode("speculative") is Mode.FORCE_OFF  # last-known kept
        server.start()
        await until(lambda: b.mode("draft") is Mode.FORCE_ON, "the pending override reaches B")
        assert not a.overrides.describe("draft")["pending"]
        assert a.store.up and b.store.up
        await a.aclose()
        await b.aclose()

    run(server, scenario)


def test_start_does_not_wait_past_its_bound_when_the_store_is_down(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")  # never started

    async def scenario() -> None:
        replica = Replica(server.url)
        replica.store.start()
        await replica.overrides.start(0.2)
        assert replica.mode("speculative") is Mode.AUTO and not replica.store.up
        await replica.aclose()

    asyncio.run(scenario())


def test_a_store_that_lost_its_data_still_carries_new_overrides(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()

    async def scenario() -> None:
        a, b = await Replica(server.url).start(), await Replica(server.url).start()
        for _ in range(3):
            await a.overrides.set("speculative", Mode.FORCE_OFF, "admin:force_off")
        await until(lambda: b.overrides.describe("speculative")["version"] == 3, "B applies version 3")
        await a.store.client.flushall()  # versions start again from 1
        await a.overrides.set("speculative", Mode.FORCE_ON, "admin:force_on")
        await until(lambda: b.mode("speculative") is Mode.FORCE_ON, "B applies the lower version the hash holds")
        # 1, or 2 when a replica wrote its known override back before the new one
        assert b.overrides.describe("speculative")["version"] in (1, 2)
        await until(lambda: a.overrides.describe("speculative")["version"]
                    == b.overrides.describe("speculative")["version"], "A and B apply the same entry")
        await a.aclose()
        await b.aclose()

    run(server, scenario)


def test_a_paused_store_holds_a_put_here_and_takes_it_when_it_resumes(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()

    async def scenario() -> None:
        a, b = await Replica(server.url).start(), await Replica(server.url).start()
        server.pause()  # SIGSTOP: connections stay open, nothing answers
        try:
            flag, shared = await a.overrides.set("speculative", Mode.FORCE_OFF, "admin:force_off")
            assert not shared and flag.mode is Mode.FORCE_OFF and not a.store.up
        finally:
            server.resume()
        await until(lambda: b.mode("speculative") is Mode.FORCE_OFF, "B applies it once Redis answers")
        assert not a.overrides.describe("speculative")["pending"]
        await a.aclose()
        await b.aclose()

    run(server, scenario)


def test_a_store_that_restarts_empty_gets_the_known_overrides_back_once(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()

    async def scenario() -> None:
        a, b = await Replica(server.url).start(), await Replica(server.url).start()
        for _ in range(3):
            await a.overrides.set("speculative", Mode.FORCE_OFF, "admin:force_off")
        await b.overrides.set("draft", Mode.AUTO, "admin:auto")  # an explicit auto is an override too
        await until(lambda: a.overrides.describe("draft")["version"] == 4, "A applies B's override")
        await until(lambda: b.overrides.describe("speculative")["version"] == 3, "B applies A's override")
        with structlog.testing.capture_logs() as logs:
            server.kill()  # a restart without persistence: the data is gone
            shutil.rmtree(server.directory)
            server.start()
            async with asyncio.timeout(20.0):  # a hang guard only
                while set(await a.store.client.hkeys(a.overrides.hash_key)) != {b"speculative", b"draft"}:
                    await asyncio.sleep(0.02)
        # One new version per pool, however many replicas wrote back at once.
        assert await a.store.client.get(a.overrides.version_key) == b"2"
        late = await Replica(server.url).start()
        assert late.mode("speculative") is Mode.FORCE_OFF
        assert late.flags.snapshot()["speculative"].reason == "admin:force_off"
        assert late.overrides.describe("draft")["version"] is not None
        for replica in (a, b):
            await until(lambda replica=replica: all(
                replica.overrides.describe(pool)["version"] == late.overrides.describe(pool)["version"]
                for pool in POOLS), "every replica applies the written-back entries")
        lost = [line for line in logs if line["event"] == "overrides_lost_by_store"]
        assert 1 <= len(lost) <= 2, lost  # at most once per replica
        assert all(set(line["pools"]) <= {"speculative", "draft"} for line in lost)
        for replica in (a, b, late):
            await replica.aclose()

    run(server, scenario)
