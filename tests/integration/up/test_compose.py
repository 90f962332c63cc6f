"""The compose `cpu` profile stops its engines the way `specgate up` does: an
init as PID 1 forwards SIGTERM and reaps, and the stop grace outlasts the
engine's own drain. Checked on what docker-compose itself resolves."""

from __future__ import annotations

import re

from backends.engine.cli import DRAIN_S
from tests.unit.deploy.test_compose import resolved


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"([\d.]+)(h|ms|m|s)", duration)
    assert parts, duration
    return sum(float(value) * units[unit] for value, unit in parts)


def test_cpu_engines_run_under_an_init_with_a_grace_beyond_their_drain():
    services = resolved("--profile", "cpu")["services"]
    for name in ("engine-speculative", "engine-standard"):
        service = services[name]
        assert service.get("init") is True, f"{name}: no init to forward SIGTERM and reap"
        grace = seconds(service.get("stop_grace_period", "10s"))  # Docker's default
        assert grace > DRAIN_S, f"{name}: SIGKILL after {grace:g} s, before the engine's {DRAIN_S} s drain ends"
