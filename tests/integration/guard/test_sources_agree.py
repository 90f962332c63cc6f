"""The scrape source and the Prometheus source compute the same signals from the
same fake counters; custom PromQL replaces single signals."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.control.signals import PrometheusSource, ScrapeSource, SignalError, Target
from gateway.policy.guard import GuardSpec
from tests.integration.guard.conftest import Feeder

pytestmark = pytest.mark.slow  # a real Prometheus server

WINDOW_S = 8


def test_scrape_and_prometheus_sources_agree(fakes, prometheus):
    spec_fake, std_fake = fakes
    spec_fake.set_load(running=4, waiting=1)
    targets = [Target("speculative", "vllm", (spec_fake.url,)), Target("standard", "vllm", (std_fake.url,))]
    spec = GuardSpec(source="prometheus", window=f"{WINDOW_S}s")

    async def read_both() -> tuple[dict, dict]:
        scrape, prom = ScrapeSource(), PrometheusSource(prometheus.url)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # Prometheus' first scrapes come a few seconds late
                answer = await prom.read(targets, spec)
                if answer["speculative"].acceptance_rate is not None:
                    break
                await asyncio.sleep(0.5)
            for _ in range(WINDOW_S + 1):  # the scrape source fills its own window
                await scrape.read(targets, spec)
                await asyncio.sleep(1)
            return dict(await scrape.read(targets, spec)), dict(await prom.read(targets, spec))
        finally:
            await scrape.aclose()
            await prom.aclose()

    with Feeder(spec_fake, acceptance=0.7), Feeder(std_fake):
        scraped, queried = asyncio.run(read_both())

    for pool in ("speculative", "standard"):
        a, b = scraped[pool], queried[pool]
        assert set(a.endpoints) == set(b.endpoints) and len(a.endpoints) == 1
        assert a.volume_tokens == pytest.approx(b.volume_tokens, rel=0.2)
        for name in ("itl_p95", "tpot_p95", "e2e_p95"):
            assert getattr(a, name) is not None and getattr(a, name) == pytest.approx(getattr(b, name), rel=0.05)
        assert (a.running, a.waiting) == (b.running, b.waiting)
    a, b = scraped["speculative"], queried["speculative"]
    assert a.acceptance_rate == pytest.approx(2 / 3, abs=0.01)  # 0.7 of 3 positions: 2 accepted
    assert a.acceptance_rate == pytest.approx(b.acceptance_rate, abs=0.01)
    assert a.mean_accepted_length == pytest.approx(b.mean_accepted_length, abs=0.03)
    assert a.per_position == pytest.approx(b.per_position, abs=0.02)
    assert (a.running, a.waiting) == (4, 1)
    assert scraped["standard"].acceptance_rate is None and scraped["standard"].volume_tokens == 0


def test_custom_queries_and_query_errors(fakes, prometheus):
    spec_fake, _ = fakes
    spec_fake.set_load(running=3, waiting=0)
    target = Target("speculative", "vllm", (spec_fake.url,))
    custom = GuardSpec(source="prometheus", window="10s",
                       queries={"running": 'sum({__name__=~"vllm[:_]num_requests_running",$selector}) * 10'})
    broken = GuardSpec(source="prometheus", queries={"accept_rate": "sum(rate(oops[$window])"})

    async def run() -> tuple[float | None, str]:
        source = PrometheusSource(prometheus.url)
        try:
            deadline = time.monotonic() + 30
            running = None
            while running is None and time.monotonic() < deadline:
                running = (await source.read([target], custom))["speculative"].running
                await asyncio.sleep(0.5)
            with pytest.raises(SignalError) as error:
                await source.read([target], broken)
            return running, str(error.value)
        finally:
            await source.aclose()

    running, error = asyncio.run(run())
    assert running == 30
    assert "query failed (400)" in error
