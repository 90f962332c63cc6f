"""Per-class speculation: token timing per traffic class, and the guard's verdicts."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.decide.features import extract_features
from gateway.decide.routing import decide
from gateway.decide.traffic import ClassLatency
from gateway.flags import Mode
from gateway.policy.classes import temperature_band, traffic_class
from gateway.upstream.meter import TokenMeter
from tests.unit.guard.conftest import FakeClock, signals

CLASSES = {"enabled": True, "min_samples": 3, "slower_pct": 10}


@pytest.mark.parametrize("temperature, bucket", [(0, "greedy"), (0.3, "low"), (0.5, "low"), (0.7, "mid"),
                                                 (1.0, "mid"), (1.3, "hot")])
def test_temperature_buckets(temperature, bucket):
    assert temperature_band(temperature) == bucket
    assert traffic_class("code", temperature) == f"code/{bucket}"


class ListStream(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk


def meter_over(chunks: list[bytes], step: float = 0.01) -> TokenMeter:
    clock = FakeClock(0.0)

    def tick() -> float:
        clock.advance(step)
        return clock.now

    meter = TokenMeter(ListStream(chunks), clock=tick)

    async def drain() -> list[bytes]:
        return [chunk async for chunk in meter]

    assert asyncio.run(drain()) == chunks, "the stream passes through unchanged"
    return meter


def test_token_meter_counts_events_and_prefers_usage():
    events = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'] * 5 + [b"data: [DONE]\n\n"]
    meter = meter_over(events)
    assert meter.tokens() == 5
    assert meter.time_per_token() == pytest.approx(0.05 / 4)  # 6 events 0.01 s apart; 4 gaps/token
    usage = events[:5] + [b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":11}}\n\n'
                          b"data: [DONE]\n\n"]
    assert meter_over(usage).tokens() == 11
    assert meter_over([b": keepalive\n\n", b"data: [DONE]\n\n"]).time_per_token() is None


def test_class_latency_window_and_comparison():
    clock = FakeClock()
    latency = ClassLatency(clock=clock, max_samples=4)
    for value in (0.02, 0.03, 0.04):
        latency.record("code/low", "speculative", value)
        latency.record("code/low", "standard", 0.02)
    latency.record("chat/mid", "speculative", 0.01)  # too few samples to compare
    [comparison] = latency.compare("speculative", "standard", window_s=60, min_samples=3)
    assert comparison.traffic_class == "code/low" and comparison.slower_pct == pytest.approx(50)
    clock.advance(61)
    assert latency.compare("speculative", "standard", window_s=60, min_samples=3) == []
    for _ in range(10):
        latency.record("x/low", "standard", 0.5)
    assert len(latency.samples("x/low", "standard", 60)) == 4, "bounded per window"


def feed(rig, traffic: str, spec_s: float, std_s: float, n: int = 3) -> None:
    for _ in range(n):
        rig.classes.record(traffic, "speculative", spec_s)
        rig.classes.record(traffic, "standard", std_s)


def request(rig, content: str, temperature: float):
    policy = rig.runtime.policy
    body = {"messages": [{"role": "user", "content": content}], "temperature": temperature}
    return extract_features(body, "chat", policy.defaults, policy.classifier, {})


def test_a_slower_class_leaves_the_pool_while_others_stay(rig_for):
    rig = rig_for(classes=CLASSES)
    feed(rig, "code/low", spec_s=0.030, std_s=0.020)  # 50 % slower with speculation
    feed(rig, "chat/low", spec_s=0.010, std_s=0.020)  # twice as fast
    rig.check(signals(0.8))
    assert rig.enabled, "the pool as a whole stays on"
    flag = rig.flags.get("speculative")
    assert flag.disabled_classes == {"code/low"}
    policy = rig.runtime.policy
    code, chat = request(rig, "def f(): pass", 0.3), request(rig, "hello", 0.3)
    decision = decide(code, policy, rig.flags.snapshot(), draw=0.5)
    assert decision.pool == "standard" and "class code/low" in decision.reason
    assert decide(code, policy, rig.flags.snapshot(), draw=0.01).probe, "probes keep the class measured"
    assert decide(chat, policy, rig.flags.snapshot(), draw=0.5).pool == "speculative"
    assert decide(request(rig, "def g(): pass", 1.0), policy, rig.flags.snapshot(), 0.5).pool == "speculative"
    status = rig.guard.status()["pools"]["speculative"]["classes"]
    assert status["disabled"] == ["code/low"] and len(status["compared"]) == 2

    rig.flags.set_mode("speculative", Mode.FORCE_ON, reason="admin:force_on")
    assert decide(code, policy, rig.flags.snapshot(), 0.5).pool == "speculative", "force_on overrides"
    rig.flags.set_mode("speculative", Mode.AUTO, reason="admin:auto")

    rig.clock.advance(120)  # the window empties: too few samples, the verdict holds
    rig.check(signals(0.8))
    assert rig.flags.get("speculative").disabled_classes == {"code/low"}
    feed(rig, "code/low", spec_s=0.020, std_s=0.020)
    rig.check(signals(0.8))
    assert rig.flags.get("speculative").disabled_classes == frozenset()


def test_classes_off_by_default(rig_for):
    rig = rig_for()
    feed(rig, "code/low", spec_s=0.030, std_s=0.020)
    rig.check(signals(0.8))
    assert rig.flags.get("speculative").disabled_classes == frozenset()
