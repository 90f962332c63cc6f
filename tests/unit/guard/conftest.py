"""A guard wired to a fake clock and a scripted signal source."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
import yaml

from gateway.control.guard import Guard
from gateway.control.signals import PoolSignals, SignalError, Target
from gateway.decide.traffic import ClassLatency
from gateway.flags import FlagStore
from gateway.metrics import GatewayMetrics
from gateway.policy.compiled import Policy
from gateway.policy.guard import GuardSpec
from gateway.policy.loader import parse_policy
from gateway.upstream.runtime import Runtime


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def signals(acceptance: float | None = 0.8, volume: float = 1000.0, tpot: float | None = 0.02,
            running: float | None = 1, waiting: float | None = 0) -> PoolSignals:
    return PoolSignals(acceptance_rate=acceptance, mean_accepted_length=None, per_position=(),
                       volume_tokens=volume, itl_p95=None, e2e_p95=None, tpot_p95=tpot,
                       running=running, waiting=waiting)


@dataclass
class FakeSource:
    """Answers what the test put in `next` (pool -> PoolSignals), or raises `error`."""
    next: dict[str, PoolSignals] = field(default_factory=dict)
    error: str | None = None
    reads: list[list[str]] = field(default_factory=list)

    async def read(self, targets: Sequence[Target], spec: GuardSpec) -> Mapping[str, PoolSignals]:
        self.reads.append([t.pool for t in targets])
        if self.error is not None:
            raise SignalError(self.error)
        return {t.pool: self.next.get(t.pool, signals(acceptance=None, volume=0, tpot=None)) for t in targets}


def make_policy(**guard) -> Policy:
    spec = {
        "version": 1,
        "pools": {
            "speculative": {"kind": "speculative", "endpoints": [{"url": "http://127.0.0.1:9001"}],
                            "fallback": "standard"},
            "standard": {"kind": "standard", "endpoints": [{"url": "http://127.0.0.1:9002"}]},
        },
        "domains": {"code": {"patterns": ["def "]}},
        "rules": [{"name": "default", "route": "speculative"}],
        "guard": {"source": "prometheus", "interval_s": 1, "window": "1m",
                  "speculative": {"trip_after": 3, "recover_after": 5, "min_hold_s": 60,
                                  "min_draft_tokens": 200}, **guard},
    }
    return parse_policy(yaml.safe_dump(spec), "test-policy.yaml")


@dataclass
class Rig:
    guard: Guard
    source: FakeSource
    clock: FakeClock
    flags: FlagStore
    metrics: GatewayMetrics
    runtime: Runtime
    classes: ClassLatency

    def check(self, spec: PoolSignals | None = None, std: PoolSignals | None = None,
              advance: float = 1.0) -> None:
        if spec is not None:
            self.source.next["speculative"] = spec
        if std is not None:
            self.source.next["standard"] = std
        self.clock.advance(advance)
        asyncio.run(self.guard.check())

    @property
    def enabled(self) -> bool:
        return self.flags.get("speculative").guard_enabled

    def guard_up(self) -> float:
        return self.metrics.registry.get_sample_value("specgate_guard_up")


@pytest.fixture
def rig_for():
    def build(policy: Policy | None = None, **guard) -> Rig:
        policy = policy or make_policy(**guard)
        clock = FakeClock()
        runtime = Runtime(policy)
        flags = FlagStore(["speculative"], clock=clock)
        metrics = GatewayMetrics()
        source = FakeSource()
        classes = ClassLatency(clock=clock)
        guard_ = Guard(runtime, flags, metrics, {"prometheus": source, "scrape": source}, clock=clock,
                       class_latency=classes)
        return Rig(guard_, source, clock, flags, metrics, runtime, classes)
    return build
