"""StateStore against a real redis-server: keys, up and down, one warning per outage."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import structlog
from pydantic import ValidationError

from gateway.edge.app import state_store
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings, redact_url
from gateway.state.store import STATE_ERRORS, StateStore, backoff
from specgate.cli import main
from tests.fakes.process import free_port
from tests.fakes.redis_server import RedisServer


def gauge(metrics: GatewayMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def test_keys_are_namespaced() -> None:
    async def main() -> None:
        store = StateStore("redis://127.0.0.1:1/0", namespace="blue")
        assert store.key("overrides") == "specgate:blue:overrides"
        await store.aclose()
    asyncio.run(main())


def test_backoff_doubles_and_is_capped() -> None:
    assert backoff(0.5, 0) == 0.5
    assert backoff(0.1, 1) == 0.2
    assert backoff(0.5, 10) == 1.0


@pytest.mark.slow
def test_up_down_and_one_warning_per_outage(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    metrics = GatewayMetrics()

    async def main() -> list[str]:
        store = StateStore(server.url, metrics=metrics, timeout_s=0.5)
        with structlog.testing.capture_logs() as logs:
            store.start()
            assert await store.wait_up(10)
            assert gauge(metrics, "specgate_state_up") == 1
            server.kill()
            while store.up:
                await asyncio.sleep(0.05)
            assert gauge(metrics, "specgate_state_up") == 0
            await asyncio.sleep(1.5)  # several failed pings: still one warning
            server.start()
            assert await store.wait_up(10)
            await store.aclose()
        return [entry["event"] for entry in logs]

    try:
        events = asyncio.run(main())
    finally:
        server.stop()
    assert events.count("state_store_down") == 1
    assert events.count("state_store_up") == 1
    assert (metrics.registry.get_sample_value("specgate_state_errors_total", {"part": "ping"}) or 0) >= 2


def test_a_store_that_never_answers_is_down_and_run_raises() -> None:
    async def main() -> None:
        store = StateStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
        assert not await store.wait_up(0.3)
        with pytest.raises(STATE_ERRORS):
            await store.run("test", lambda client: client.ping())
        assert not store.up and store.down_since is not None
        await store.aclose()
    asyncio.run(main())


def test_the_state_url_names_a_redis_or_is_unset() -> None:
    assert Settings(state_url="").state_url is None
    assert Settings().state_url is None
    for url in ("redis://127.0.0.1:6379/0", "rediss://u:p@example.com:6380/0", "unix:///run/redis.sock?db=1"):
        assert Settings(state_url=url).state_url == url
    with pytest.raises(ValidationError, match="redis://, rediss:// or unix://"):
        Settings(state_url="http://127.0.0.1:6379")


def test_a_refused_state_url_is_named_without_its_user_and_password(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECGATE_STATE_URL", "redis:/admin:s3cret@redis.internal:6379/0?password=hunter2")
    monkeypatch.setenv("SPECGATE_PORT", "eighty")
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "s3cret" not in err and "admin" not in err and "hunter2" not in err
    assert ":***@redis.internal:6379/0?password=***" in err  # where the store is stays readable
    assert "input_value='eighty'" in err  # other settings' values are not hidden


def test_state_configured_tells_a_store_down_from_no_store() -> None:
    alone, shared = GatewayMetrics(), GatewayMetrics()
    assert state_store(Settings(), alone) is None
    store = state_store(Settings(state_url=f"redis://127.0.0.1:{free_port()}/0"), shared)
    assert store is not None
    asyncio.run(store.aclose())
    assert gauge(alone, "specgate_state_configured") == 0 and gauge(alone, "specgate_state_up") == 0
    assert gauge(shared, "specgate_state_configured") == 1


@pytest.mark.parametrize(("url", "shown"), [
    ("http://user:pw@host:6379/0", "http://:***@host:6379/0"),
    ("redis//:p@ss@host:6379", ":***@host:6379"),
    ("unx:///run/redis.sock?db=0&password=pw", "unx:///run/redis.sock?db=0&password=***"),
    ("http://127.0.0.1:6379", "http://127.0.0.1:6379"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_loop_stops_when_cancelled_even_if_its_step_swallows_the_cancellation() -> None:
    async def main() -> int:
        store = StateStore(f"redis://127.0.0.1:{free_port()}/0")
        steps = 0
        entered = asyncio.Event()

        async def swallowing_step() -> None:  # as the client can do inside a read
            nonlocal steps
            steps += 1
            entered.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise ConnectionError("connection closed by cancellation") from None

        task = asyncio.create_task(store.repeat("test", swallowing_step, 10))
        await entered.wait()
        task.cancel()
        async with asyncio.timeout(20):  # a hang guard: the loop must end at once
            with pytest.raises(asyncio.CancelledError):
                await task
        await store.aclose()
        return steps

    assert asyncio.run(main()) == 1
