"""The guard's lease on a real redis-server: one leader among several, exactly one
new leader after the holder dies, and a fenced write from an old leader refused."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.control.leader import Leader
from gateway.control.verdicts import stop
from gateway.flags import PoolFlag
from gateway.state.store import StateStore
from tests.unit.gateway.leader_rig import TTL_S, Replica, leaders, redis_url, replicas, wait_for

__all__ = ["redis_url"]  # the fixture


def test_settings_are_checked() -> None:
    async def main() -> None:
        store = StateStore("redis://127.0.0.1:1/0")
        with pytest.raises(ValueError, match="more often"):
            Leader(store, ttl_s=1.0, renew_s=1.0)
        assert Leader(store, ttl_s=3.0).renew_s == 1.0
        await store.aclose()
    asyncio.run(main())


@pytest.mark.slow
def test_one_leader_then_exactly_one_new_one_after_it_dies(redis_url: str) -> None:
    async def main() -> None:
        async with replicas(redis_url, 3) as group:
            for replica in group:
                replica.start()
            await wait_for(lambda: len(leaders(group)) == 1, "one leader")
            first = leaders(group)[0]
            token = first.leader.lead()
            client = first.store.client
            assert await client.get("specgate:t:guard:lease") == first.leader.holder.encode()
            assert int(await client.get("specgate:t:guard:fence")) == token
            for _ in range(int(3 * TTL_S / 0.05)):  # several TTLs: renewed, never taken over
                assert leaders(group) == [first]
                await asyncio.sleep(0.05)

            await first.die()
            seen: set[str] = set()

            def new_leader() -> bool:
                now = leaders(group)
                assert len(now) <= 1, "two processes lead at once"
                seen.update(r.leader.holder for r in now)
                return bool(now) and now[0] is not first
            await wait_for(new_leader, "a new leader")
            second = leaders(group)[0]
            assert seen - {first.leader.holder} == {second.leader.holder}
            assert second.leader.lead() == token + 1
            assert await client.get("specgate:t:guard:lease") == second.leader.holder.encode()
            assert first.leader.lead() is None  # its own clock says its lease is over
            assert first.changes == [True, False] and second.changes == [True]
            assert second.leader.status()["leader"] is True and first.leader.status()["leader"] is False
    asyncio.run(main())


@pytest.mark.slow
def test_release_hands_over_without_waiting_for_the_ttl(redis_url: str) -> None:
    async def main() -> None:
        async with replicas(redis_url, 2) as (a, b):
            a.start()
            await a.leads()
            b.start()
            await a.die()
            await a.leader.release()
            # free, or already b's: a host stalled past the 0.6 s TTL may have let b take it first
            assert await a.store.client.get("specgate:t:guard:lease") in (None, b.leader.holder.encode())
            await b.leads()
    asyncio.run(main())


def off(reason: str) -> dict[str, PoolFlag]:
    return {"spec": PoolFlag(guard_enabled=False, reason=reason, disabled_classes=frozenset({"code/t0"}))}


async def stored(replica: Replica) -> dict[str, str]:
    raw = await replica.store.client.hgetall("specgate:t:guard:verdicts")
    return {k.decode(): v.decode() for k, v in raw.items()}


@pytest.mark.slow
def test_an_old_leaders_late_write_is_refused(redis_url: str) -> None:
    async def main() -> None:
        async with replicas(redis_url, 2) as (a, b):
            a.start()
            old = await a.leads()
            assert await a.verdicts.publish(old, off("low_acceptance: a"), {"spec": 3})
            await a.die()  # paused: it still holds its token, its lease runs out
            b.start()
            await b.leads()
            new = b.leader.lead()
            assert new == old + 1

            # b has not written yet: the token issued to b already fences a out
            assert not await a.verdicts.publish(old, off("low_acceptance: late"), {})
            assert (await stored(a))["token"] == str(old)
            assert await b.verdicts.publish(new, off("low_acceptance: b"), {"spec": 5})
            assert not await a.verdicts.publish(old, off("low_acceptance: later"), {})
            after = await stored(a)
            assert after["token"] == str(new) and after["holder"] == b.leader.holder
            assert json.loads(after["verdicts"])["pools"]["spec"]["reason"] == "low_acceptance: b"
            assert a.verdicts.refused == 2 and a.leader.token is None  # it stepped down
    asyncio.run(main())


@pytest.mark.slow
def test_after_the_store_lost_its_data_an_old_token_is_refused_and_a_new_leader_writes(redis_url: str) -> None:
    async def main() -> None:
        async with replicas(redis_url, 2) as (a, b):
            await a.store.client.set(a.leader.fence_key, 5)  # five terms before this one
            a.start()
            old = await a.leads()
            assert old == 6 and await a.verdicts.publish(old, off("low_acceptance: a"), {})
            await a.die()  # it has not noticed yet: it still holds its token
            await a.store.client.flushall()  # the lease, the fence counter and the verdicts are gone
            # a token the store did not issue (its counter starts again) is refused
            assert not await a.verdicts.publish(old, off("low_acceptance: late"), {})
            assert await stored(a) == {} and a.leader.token is None
            b.start()
            new = await b.leads()
            assert new == 1 and await b.verdicts.publish(new, off("low_acceptance: b"), {})
            assert (await stored(b))["token"] == "1"
    asyncio.run(main())


@pytest.mark.slow
def test_followers_apply_the_leaders_verdicts_even_without_the_message(redis_url: str) -> None:
    async def main() -> None:
        async with replicas(redis_url, 2) as (a, b):
            a.start()
            await a.leads()
            follow = [asyncio.create_task(r.verdicts.run()) for r in (a, b)]
            try:
                token = await a.leads()
                assert await a.verdicts.publish(token, off("low_acceptance: 0.2 < 0.4"), {"spec": 7})
                await wait_for(lambda: not b.flags.get("spec").guard_enabled, "b applies the verdict")
                flag = b.flags.get("spec")
                assert flag.reason == "low_acceptance: 0.2 < 0.4"
                assert flag.disabled_classes == {"code/t0"}
                assert b.load.snapshot() == {"spec": 7}
                # written without a message (as if it were lost): the periodic read catches up
                verdicts = json.loads((await stored(a))["verdicts"])
                verdicts["pools"]["spec"].update(guard_enabled=True, reason="recovered: 0.9")
                await a.store.client.hset("specgate:t:guard:verdicts", "verdicts", json.dumps(verdicts))
                await wait_for(lambda: b.flags.get("spec").guard_enabled, "b reads it again")
                assert a.flags.get("spec").reason == "initial"  # the leader's flags are its own guard's
            finally:
                await stop(follow)
    asyncio.run(main())


@pytest.mark.slow
def test_a_new_leader_starts_from_the_stored_verdicts(redis_url: str) -> None:
    async def main() -> None:
        async with replicas(redis_url, 2) as (a, b):
            a.start()
            token = await a.leads()
            assert await a.verdicts.publish(token, off("low_acceptance: by a"), {"spec": 4})
            await a.die()
            b.start()  # b never followed (it started after a wrote): it reads them on taking the lease
            await b.leads()
            assert b.flags.get("spec").reason == "low_acceptance: by a" and b.load.snapshot() == {"spec": 4}
    asyncio.run(main())
