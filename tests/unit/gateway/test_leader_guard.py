"""Guards sharing a real redis-server: only the leader reads and judges, the
follower applies its verdicts, and a new leader starts its streaks again and
waits min_hold_s before a recovery, so a change of leader flaps nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.control.guard import Guard
from gateway.control.verdicts import stop
from gateway.metrics import GatewayMetrics
from gateway.upstream.runtime import Runtime
from tests.fakes.redis_server import RedisServer
from tests.unit.gateway.leader_rig import Replica, redis_url, replicas, wait_for
from tests.unit.guard.conftest import FakeClock, FakeSource, make_policy, signals

pytestmark = pytest.mark.slow  # a real redis-server per test

__all__ = ["redis_url"]  # the fixture

POOLS = ("speculative",)
BAD = signals(acceptance=0.1, volume=1000.0)
GOOD = signals(acceptance=0.9, volume=1000.0)


class Rig:
    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.source = FakeSource(next={"speculative": BAD})
        self.clock = FakeClock()
        self.metrics = GatewayMetrics()
        self.guard = Guard(Runtime(make_policy()), replica.flags, self.metrics,
                           {"prometheus": self.source}, clock=self.clock,
                           leadership=replica.leader, sink=replica.verdicts)

    async def check(self) -> None:
        self.clock.advance(1.0)
        await self.guard.check()

    @property
    def enabled(self) -> bool:
        return self.replica.flags.get("speculative").guard_enabled


def test_the_leader_judges_the_follower_follows_a_new_leader_holds(redis_url: str) -> None:
    async def main() -> None:
        async with replicas(redis_url, 2, POOLS) as (a, b):
            lead, follow = Rig(a), Rig(b)
            a.start()
            await a.leads()
            b.start()
            following = asyncio.create_task(b.verdicts.run())
            try:
                for _ in range(3):  # trip_after: 3
                    await lead.check()
                    await follow.check()
                assert not lead.enabled
                await wait_for(lambda: not follow.enabled, "the follower applies the trip")
                assert follow.source.reads == []  # a follower never reads the signals
                assert b.flags.get("speculative").reason.startswith("low_acceptance")
                status = follow.guard.status()
                assert status["leader"] is False and status["pools"]["speculative"]["verdict"] == "following"
                assert lead.guard.status()["leader"] is True
                assert lead.guard.status()["leadership"]["token"] == a.leader.lead()

                await a.die()  # the leader is gone: b takes over and judges from here
                await b.leads()
                follow.source.next["speculative"] = GOOD
                for _ in range(6):  # recover_after: 5, but min_hold_s (60) counts from the takeover
                    await follow.check()
                assert not follow.enabled and len(follow.source.reads) == 6
                follow.clock.advance(60)
                await follow.check()
                assert follow.enabled
                stored = await b.store.client.hgetall("specgate:t:guard:verdicts")
                assert int(stored[b"token"]) == b.leader.lead()
                assert json.loads(stored[b"verdicts"])["pools"]["speculative"]["guard_enabled"] is True
            finally:
                await stop([following])
    asyncio.run(main())


def test_redis_down_nobody_flips_and_back_up_they_converge(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    restarted = RedisServer(server.directory, port=server.port)

    async def main() -> None:
        async with replicas(server.url, 2, POOLS) as (a, b):
            lead, follow = Rig(a), Rig(b)
            a.start()
            await a.leads()
            b.start()
            following = [asyncio.create_task(r.verdicts.run()) for r in (a, b)]
            try:
                for _ in range(3):
                    await lead.check()
                await wait_for(lambda: not follow.enabled and follow.replica.load.snapshot() != {},
                               "the follower applies the trip and the load")

                server.kill()
                await wait_for(lambda: a.leader.lead() is None, "no one leads without Redis")
                await wait_for(lambda: b.load.snapshot() == {}, "the follower's reported load goes unknown")
                for rig in (lead, follow):
                    rig.source.next["speculative"] = GOOD
                    reads = len(rig.source.reads)
                    for _ in range(6):
                        rig.clock.advance(60)
                        await rig.check()
                    assert not rig.enabled and len(rig.source.reads) == reads  # no check, no flap

                await asyncio.to_thread(restarted.start)
                await wait_for(lambda: any(r.leader.lead() is not None for r in (a, b)), "a leader again")
                now = lead if a.leader.lead() is not None else follow
                for _ in range(6):
                    now.clock.advance(60)
                    await now.check()
                await wait_for(lambda: lead.enabled and follow.enabled, "both converge on the recovery")
            finally:
                await stop(following)
    try:
        asyncio.run(main())
    finally:
        restarted.stop()
        server.kill()
