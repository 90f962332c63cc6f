"""Compose stops its services the way `specgate up` does: an init as PID 1
forwards SIGTERM and reaps, and the stop grace outlasts the service's own
drain. Checked on what docker-compose itself resolves, for both profiles."""

from __future__ import annotations

import re

import pytest

from backends.engine.options import DRAIN_S
from gateway.settings import Settings
from tests.unit.deploy.test_compose import resolved

pytestmark = pytest.mark.slow  # docker-compose


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"([\d.]+)(h|ms|m|s)", duration)
    assert parts, duration
    return sum(float(value) * units[unit] for value, unit in parts)


GATEWAY_DRAIN_S = Settings.model_fields["drain_timeout_s"].default


@pytest.mark.parametrize("profile, drains", [
    ("cpu", {"engine-speculative": DRAIN_S, "engine-standard": DRAIN_S, "gateway-cpu": GATEWAY_DRAIN_S,
             "state": 0}),
    ("gpu", {"vllm-speculative": 0, "vllm-standard": 0, "gateway": GATEWAY_DRAIN_S, "state": 0}),
])
def test_services_run_under_an_init_with_a_grace_beyond_their_drain(profile, drains):
    services = resolved("--profile", profile)["services"]
    for name, drain in drains.items():
        service = services[name]
        assert service.get("init") is True, f"{name}: no init to forward SIGTERM and reap"
        grace = seconds(service.get("stop_grace_period", "10s"))  # Docker's default
        assert grace > drain, f"{name}: SIGKILL after {grace:g} s, before its {drain:g} s drain ends"
