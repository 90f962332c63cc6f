"""Three gateways sharing a real redis-server, their guards scraping the same
fake vLLM backends: one leads, the trip reaches all three, the flip is logged
once at info, and a leader stopped cleanly hands the lease over."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from structlog.testing import capture_logs

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.settings import Settings
from tests.fakes.redis_server import RedisServer
from tests.fakes.waiting import wait_until
from tests.integration.gateway.conftest import ADMIN_TOKEN, policy_dict
from tests.integration.guard.conftest import fakes

pytestmark = pytest.mark.slow  # a real redis-server

__all__ = ["fakes"]  # the fixture

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
# Trips after two bad checks; min_hold_s keeps any guard from recovering during the test.
# The lease outlives every wait of the test: leadership never drifts on a loaded host (a renewal
# late by over a TTL would hand it to a follower), and the hand-over below can only come from the
# clean stop releasing the lease, never from its expiry.
LEASE_TTL_S = 120.0
GUARD = {"source": "scrape", "interval_s": 0.5, "window": "3s",
         "speculative": {"trip_after": 2, "recover_after": 2, "min_hold_s": 30, "min_draft_tokens": 30,
                         "probe_fraction": 0.3}}


class Replica:
    def __init__(self, policy: Path, state_url: str) -> None:
        settings = Settings(policy=policy, admin_token=ADMIN_TOKEN, state_url=state_url,
                            guard_lease_ttl_s=LEASE_TTL_S, guard_lease_renew_s=0.25)
        self.server = BackgroundServer(create_app(settings), lifespan="on").start()
        self.admin = httpx.Client(base_url=self.server.url, headers=AUTH, timeout=10)

    def guard(self) -> dict[str, Any]:
        return dict(self.admin.get("/admin/guard").json())

    def enabled(self) -> bool:
        return bool(self.admin.get("/admin/flags").json()["speculative"]["enabled"])

    def leader_gauge(self) -> str:
        lines = self.admin.get("/metrics").text.splitlines()
        return next(line.split()[-1] for line in lines if line.startswith("specgate_guard_leader "))

    def close(self) -> None:
        if not self.admin.is_closed:
            self.admin.close()
            self.server.stop(graceful=True)


@pytest.fixture
def replicas(fakes, tmp_path: Path) -> Iterator[list[Replica]]:
    spec_fake, std_fake = fakes
    spec_fake.spec_acceptance = 0.2  # one draft of 3 tokens per served token, 1 accepted
    spec_fake.script(chunks=20)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({**policy_dict([spec_fake.url], [std_fake.url]), "guard": GUARD}))
    with RedisServer(tmp_path / "redis") as redis_server, ExitStack() as stack:
        group = []
        for _ in range(3):
            replica = Replica(path, redis_server.url)
            stack.callback(replica.close)
            group.append(replica)
        yield group


def test_one_guard_leads_three_replicas_and_the_flip_is_logged_once(replicas: list[Replica]) -> None:
    wait_until(lambda: sum(r.guard()["leader"] for r in replicas) == 1, "one leader")
    leader = next(r for r in replicas if r.guard()["leader"])
    followers = [r for r in replicas if r is not leader]
    assert leader.leader_gauge() == "1.0" and [f.leader_gauge() for f in followers] == ["0.0", "0.0"]
    client = openai.OpenAI(base_url=followers[0].server.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    served: collections.Counter[str] = collections.Counter()

    def serve() -> bool:
        raw = client.completions.with_raw_response.create(model="m", prompt="Once upon a time",
                                                          max_tokens=64, temperature=0.5)
        raw.parse()
        served[raw.headers["x-specgate-pool"]] += 1
        return True

    with capture_logs() as logs:
        wait_until(lambda: serve() and not leader.enabled(), "the leader's guard trips on live traffic")
        wait_until(lambda: not any(r.enabled() for r in followers), "the followers apply the trip")
    client.close()
    flips = [e for e in logs if e["event"] == "flag_changed" and e["enabled"] is False]
    assert [e["log_level"] for e in flips].count("info") == 1, flips
    assert [e["log_level"] for e in flips].count("debug") == 2, flips
    for follower in followers:
        status = follower.guard()
        assert status["pools"]["speculative"]["verdict"] == "following"
        assert status["pools"]["speculative"]["reason"].startswith("low_acceptance")
        assert status["leadership"]["leader"] is False
    token = leader.guard()["leadership"]["token"]

    leader.close()  # a clean stop frees the lease: another leads without waiting out the TTL
    wait_until(lambda: sum(f.guard()["leader"] for f in followers) == 1, "a new leader")
    new = next(f for f in followers if f.guard()["leader"])
    assert new.guard()["leadership"]["token"] == token + 1 and new.leader_gauge() == "1.0"
    assert not any(f.enabled() for f in followers)  # the new leader holds: min_hold_s counts from its start
