"""The wait queue's metrics are exported on the gateway's /metrics: a queued
burst shows its waiters while they wait, then how each wait ended and how
long it took. Real servers on 127.0.0.1, the official openai client."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .test_queueing import ask, queued, standard_only


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of /metrics whose name starts with specgate_queue, by name and labels."""
    text = (await client.get("/metrics")).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("specgate_queue")}


def pool_label(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset({"pool": "standard", **labels}.items())


def test_a_queued_burst_shows_on_metrics_while_waiting_and_by_outcome_after(start_gateway, std_fake):
    gw = start_gateway(standard_only(std_fake.url, max_in_flight=1, queue={"max_waiting": 2}))
    pool = gw.app.state.runtime.pools["standard"]
    std_fake.hold()

    async def main() -> tuple[dict, dict]:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="k", max_retries=0)
        async with httpx.AsyncClient(base_url=gw.url) as http:
            burst = [asyncio.create_task(ask(client)) for _ in range(3)]
            await queued(pool, 2, burst)  # one in flight, two waiting
            while_waiting = await scrape(http)
            with pytest.raises(openai.APIStatusError):
                await ask(client)  # the queue is full: refused without waiting
            std_fake.release()
            await asyncio.gather(*burst)
            after = await scrape(http)
        await client.close()
        return while_waiting, after

    try:
        while_waiting, after = asyncio.run(main())
    finally:
        std_fake.release()
    assert while_waiting[("specgate_queue_waiting", pool_label())] == 2
    assert after[("specgate_queue_waiting", pool_label())] == 0
    assert after[("specgate_queue_waits_total", pool_label(outcome="served"))] == 2
    assert after[("specgate_queue_waits_total", pool_label(outcome="full"))] == 1
    assert after[("specgate_queue_seconds_count", pool_label())] == 2  # the refused one never waited
    assert after[("specgate_queue_seconds_sum", pool_label())] > 0
