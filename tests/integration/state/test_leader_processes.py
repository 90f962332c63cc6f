"""Three processes elect one guard leader on a real redis-server.

SIGKILL the leader: exactly one other takes the lease, with the next fencing
token, within the lease TTL plus one check interval. SIGSTOP the leader in the
middle of a check until another leads, then SIGCONT it: its late write is
refused (the stored verdicts carry the new leader's token) and it steps down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fakes.redis_server import RedisServer
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.slow  # a real redis-server

ROOT = Path(__file__).resolve().parents[3]
TTL_S = 1.0
RENEW_S = 0.25
INTERVAL_S = 0.25
CHECK_S = 0.6  # long enough to stop a process in the middle of one
LEASE, FENCE, VERDICTS = "specgate:procs:guard:lease", "specgate:procs:guard:fence", "specgate:procs:guard:verdicts"



class Member:
    def __init__(self, url: str, name: str, directory: Path) -> None:
        self.name = name
        self.out = directory / f"{name}.jsonl"
        with self.out.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.state.leader_process", url, name,
                 "--ttl-s", str(TTL_S), "--renew-s", str(RENEW_S), "--interval-s", str(INTERVAL_S),
                 "--check-s", str(CHECK_S)],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out, stderr=subprocess.STDOUT)

    def events(self) -> list[dict[str, Any]]:
        lines = self.out.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]

    def last(self) -> str | None:
        events = self.events()
        return events[-1]["event"] if events else None

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def election(tmp_path: Path) -> Iterator[tuple[redis.Redis, dict[str, Member]]]:
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        members = {name: Member(server.url, name, tmp_path) for name in ("p0", "p1", "p2")}
        try:
            yield client, members
        finally:
            for member in members.values():
                member.stop()
            client.close()


def holder(client: redis.Redis) -> str | None:
    value = client.get(LEASE)
    return str(value) if value is not None else None


def test_sigkill_the_leader_exactly_one_new_leader_within_ttl_and_interval(tmp_path: Path) -> None:
    with election(tmp_path) as (client, members):
        wait_until(lambda: holder(client) is not None, "a leader")
        old = members[str(holder(client))]
        wait_until(lambda: old.last() == "written", "the leader's first verdict")
        token = int(client.get(FENCE) or 0)

        old.signal(signal.SIGKILL)
        killed = time.time()
        old.process.wait()
        wait_until(lambda: holder(client) not in (None, old.name), "a new leader")
        new = members[str(holder(client))]
        assert int(client.get(FENCE) or 0) == token + 1
        # the lease is in the store before the new leader writes that it leads: wait for its line
        wait_until(lambda: any(e["event"] == "leading" and e["t"] > killed for e in new.events()),
                   "the new leader's word that it leads")
        survivors = [m for m in members.values() if m is not old]
        took_over = [e for m in survivors for e in m.events() if e["event"] == "leading" and e["t"] > killed]
        assert [e["token"] for e in took_over] == [token + 1], "exactly one new leader"
        assert next(e for e in new.events() if e["event"] == "leading")["token"] == token + 1
        took_over_s = took_over[0]["t"] - killed
        print(f"new leader {took_over_s:.2f} s after SIGKILL (TTL {TTL_S} s, interval {INTERVAL_S} s)")
        assert took_over_s <= TTL_S + INTERVAL_S + RENEW_S
        wait_until(lambda: client.hget(VERDICTS, "token") == str(token + 1), "the new leader's verdicts")
        assert holder(client) == new.name  # and it keeps the lease


def stop_in_a_check(client: redis.Redis, members: dict[str, Member]) -> tuple[Member, int]:
    """SIGSTOP the leader right after it started a check, before it wrote its verdict."""
    for _ in range(10):
        wait_until(lambda: holder(client) is not None, "a leader")
        leader = members[str(holder(client))]
        wait_until(lambda m=leader: m.last() == "checking", "the leader starts a check")
        leader.signal(signal.SIGSTOP)
        events = leader.events()
        if events[-1]["event"] == "checking":
            return leader, int(events[-1]["token"])
        leader.signal(signal.SIGCONT)  # it wrote before the signal landed: next check
    pytest.fail("never stopped the leader in the middle of a check")


def test_a_leader_paused_past_its_lease_cannot_write_and_steps_down(tmp_path: Path) -> None:
    with election(tmp_path) as (client, members):
        old, token = stop_in_a_check(client, members)
        wait_until(lambda: holder(client) not in (None, old.name), "another leader while it sleeps")
        new = members[str(holder(client))]
        assert int(client.get(FENCE) or 0) == token + 1
        wait_until(lambda: client.hget(VERDICTS, "token") == str(token + 1), "the new leader's verdicts")

        old.signal(signal.SIGCONT)
        wait_until(lambda: any(e["event"] == "refused" for e in old.events()), "the late write refused")
        refused = next(e for e in old.events() if e["event"] == "refused")
        assert refused["token"] == token
        assert client.hget(VERDICTS, "token") == str(token + 1)
        assert client.hget(VERDICTS, "holder") == new.name
        assert json.loads(client.hget(VERDICTS, "verdicts") or "{}")["pools"]["spec"]["reason"].endswith(new.name)
        wait_until(lambda: "following" in [e["event"] for e in old.events()], "it steps down")
        stepped_down = next(e["t"] for e in old.events() if e["event"] == "following")
        written = len(new.events())
        wait_until(lambda: sum(e["event"] == "written" for e in new.events()[written:]) >= 2,
                   "two more checks by the new leader")
        assert [e for e in old.events() if e["event"] == "checking" and e["t"] > stepped_down] == []
        assert holder(client) == new.name
