"""With a state URL the flags file gives the initial modes only: read at start-up,
never watched or written, so a read-only mount (a Kubernetes ConfigMap) is fine."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from tests.fakes.process import free_port
from tests.fakes.redis_server import RedisServer
from tests.fakes.waiting import wait_until
from tests.integration.state.fleet_rig import Replica, policy

pytestmark = pytest.mark.slow  # a real redis-server

INITIAL = b"speculative: {mode: force_off}\n"


def test_the_flags_file_is_read_at_start_and_never_written_with_a_store(tmp_path: Path) -> None:
    flags_file = tmp_path / "config" / "flags.yaml"
    flags_file.parent.mkdir()
    flags_file.write_bytes(INITIAL)
    redis = RedisServer(tmp_path / "redis").start()
    backends = policy(f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}", busy_at=10)
    try:
        with structlog.testing.capture_logs() as logs:
            replica = Replica(tmp_path / "a", backends, redis.url, flags_file=flags_file)
            try:
                assert replica.admin.get("/admin/flags").json()["speculative"]["mode"] == "force_off"
                put = replica.admin.put("/admin/flags/speculative", json={"mode": "force_on"})
                assert put.status_code in (200, 202), put.text
                wait_until(lambda: replica.admin.get("/admin/flags").json()["speculative"]["mode"] == "force_on",
                           "the override applies")
            finally:
                replica.stop()  # a followed file would be written by now, at the latest at this stop
    finally:
        redis.stop()
    assert flags_file.read_bytes() == INITIAL
    assert replica.parts.flag_file is None  # not watched either
    assert sorted(path.name for path in flags_file.parent.iterdir()) == ["flags.yaml"]  # no lock, no temporary
    events = [entry["event"] for entry in logs]
    assert "flags_file_initial_only" in events
    assert not [event for event in events if event.startswith("flags_file_") and event != "flags_file_initial_only"]
