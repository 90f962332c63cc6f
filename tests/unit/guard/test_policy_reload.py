"""The policy watcher survives any file: a broken one is logged, counted and
ignored, the policy in force keeps serving, and the next good file applies."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from gateway.control.reload import PolicyReloader
from gateway.metrics import GatewayMetrics
from gateway.policy.compiled import Policy
from gateway.policy.loader import PolicyError
from tests.unit.guard.conftest import make_policy

# Deeper than PyYAML's recursive composer could follow: the bounded loader refuses it first.
NESTED = "version: 1\npools: " + "[" * 5000 + "]" * 5000 + "\n"


def policy_text(trip_after: int) -> str:
    return yaml.safe_dump(make_policy(speculative={"trip_after": trip_after}).spec.model_dump(mode="json"))


def reloads(metrics: GatewayMetrics, result: str) -> float:
    return metrics.registry.get_sample_value("specgate_policy_reloads_total", {"result": result}) or 0.0


def test_a_file_the_loader_cannot_take_apart_is_counted_and_the_watch_goes_on(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(trip_after=3))
    metrics = GatewayMetrics()
    applied: list[Policy] = []
    reloader = PolicyReloader(path, applied.append, metrics)

    async def scenario() -> None:
        watcher = asyncio.create_task(reloader.watch(0.01))
        try:
            path.write_text(NESTED)
            while not watcher.done() and reloads(metrics, "rejected") == 0:
                await asyncio.sleep(0.01)
            assert not watcher.done(), "the watcher died on the nested file"
            assert applied == [], "nothing applied from the broken file"
            assert "nested deeper than 64 levels" in (reloader.last_error or "")

            path.write_text(policy_text(trip_after=7))
            while not watcher.done() and not applied:
                await asyncio.sleep(0.01)
            assert not watcher.done()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    asyncio.run(scenario())
    assert reloads(metrics, "rejected") == 1 and reloads(metrics, "applied") == 1
    assert applied[0].spec.guard.speculative.trip_after == 7
    assert reloader.last_error is None


def test_a_reload_on_request_answers_a_policy_error_for_any_failure(tmp_path):
    """The admin API and SIGHUP call `reload`: they get a PolicyError, never RecursionError."""
    path = tmp_path / "policy.yaml"
    path.write_text(NESTED)
    metrics = GatewayMetrics()
    reloader = PolicyReloader(path, lambda policy: None, metrics)

    async def scenario() -> None:
        with pytest.raises(PolicyError) as error:
            await reloader.reload()
        assert "nested deeper than 64 levels" in str(error.value) and str(path) in str(error.value)
        await reloader.reload_quietly()

    asyncio.run(scenario())
    assert reloads(metrics, "rejected") == 2 and reloads(metrics, "error") == 0
