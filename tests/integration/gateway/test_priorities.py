"""A saturated pool under a flood of low-priority requests and a trickle of
high-priority ones: every high one is served, the low ones it displaces and
those the full queue cannot hold get 429 with Retry-After, nothing hangs.
Real servers on 127.0.0.1, the official openai client, keys from a file."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .test_queueing import standard_only

FLOOD, TRICKLE, SLOTS, WAITING = 12, 3, 2, 4
KEYS = """- {key: batch, priority: -1}
- {key: app, max_priority: 10}
"""


def say(client: openai.AsyncOpenAI, text: str, **options: Any):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}],
                                          temperature=0, max_tokens=16, timeout=60, **options)


async def until(check, flood: list[asyncio.Task[Any]], trickle: list[asyncio.Task[Any]] = ()) -> None:
    """Until `check()` holds; fails at once if a flood request ended other
    than shed, or a trickle request ended at all (the pool is held)."""
    while not check():
        for task in flood:
            if task.done() and not isinstance(task.exception(), openai.RateLimitError):
                raise AssertionError(f"a flood request ended unshed: {task.exception()}")
        for task in trickle:
            if task.done():
                raise AssertionError(f"a high-priority request ended while the pool was held: {task.exception()}")
        await asyncio.sleep(0.01)


def labels(**pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset(pairs.items())


def refused(tasks: list[asyncio.Task[Any]]) -> list[openai.RateLimitError]:
    return [t.exception() for t in tasks if t.done() and isinstance(t.exception(), openai.RateLimitError)]


def priority_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset((k, v) for k, v in s.labels.items() if k != "pool")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("specgate_priority") and s.labels.get("pool") == "standard"}


def test_a_flood_of_low_priority_never_sheds_a_trickle_of_high_priority(start_gateway, std_fake, tmp_path: Path):
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS)
    gw = start_gateway(standard_only(std_fake.url, max_in_flight=SLOTS, queue={"max_waiting": WAITING,
                                                                               "max_wait_s": 30}),
                       api_keys_file=keys)
    pool = gw.app.state.runtime.pools["standard"]
    std_fake.hold()  # answers pause after their first piece: the pool stays saturated

    async def main() -> tuple[list[Any], list[Any], str]:
        batch = openai.AsyncOpenAI(base_url=gw.base_url, api_key="batch", max_retries=0)
        app = openai.AsyncOpenAI(base_url=gw.base_url, api_key="app", max_retries=0)
        flood = [asyncio.create_task(say(batch, f"low {i}")) for i in range(FLOOD)]
        # SLOTS in flight, WAITING queued, the rest shed at once: the queue is full of equals
        await until(lambda: pool.queue.waiting == WAITING and len(refused(flood)) == FLOOD - SLOTS - WAITING, flood)
        trickle = []
        for i in range(TRICKLE):  # each evicts one low waiter and takes its place
            trickle.append(asyncio.create_task(say(app, f"high {i}", extra_headers={"x-specgate-priority": "5"})))
            await until(lambda: len(refused(flood)) == FLOOD - SLOTS - WAITING + len(trickle), flood, trickle)
            assert pool.queue.waiting == WAITING
        std_fake.release()
        served = await asyncio.gather(*trickle, *[t for t in flood if not refused([t])])
        flood_outcomes = await asyncio.gather(*flood, return_exceptions=True)
        async with httpx.AsyncClient(base_url=gw.url) as http:
            metrics = (await http.get("/metrics")).text
        for client in (batch, app):
            await client.close()
        return served, flood_outcomes, metrics

    try:
        served, flood_outcomes, metrics = asyncio.run(asyncio.wait_for(main(), 120))  # a hang guard only
    finally:
        std_fake.release()
    shed = [o for o in flood_outcomes if isinstance(o, BaseException)]
    assert all(a.choices[0].finish_reason == "stop" for a in served)
    assert len(served) == SLOTS + WAITING  # the trickle took the places of as many low waiters
    assert len(shed) == FLOOD - SLOTS - WAITING + TRICKLE
    for error in shed:
        assert isinstance(error, openai.RateLimitError), error
        assert error.code == "rate_limit_exceeded" and int(error.response.headers["retry-after"]) == 30
    evicted = [e for e in shed if "higher priority" in e.message]
    assert len(evicted) == TRICKLE
    # the backend saw the two that held the slots, then every high one before any queued low one
    order = [r.body["messages"][0]["content"].split()[0] for r in std_fake.completion_requests()]
    assert order == ["low"] * SLOTS + ["high"] * TRICKLE + ["low"] * (WAITING - TRICKLE)
    assert (pool.in_flight, pool.queue.waiting, pool.queue.handed) == (0, 0, 0)
    samples = priority_samples(metrics)
    assert samples[("specgate_priority_admitted_total", labels(tier="high"))] == TRICKLE
    assert samples[("specgate_priority_admitted_total", labels(tier="low"))] == SLOTS + WAITING - TRICKLE
    assert samples[("specgate_priority_shed_total", labels(tier="low", reason="full"))] == FLOOD - SLOTS - WAITING
    assert samples[("specgate_priority_shed_total", labels(tier="low", reason="evicted"))] == TRICKLE
    assert samples[("specgate_priority_queued_total", labels(tier="high"))] == TRICKLE
    assert samples[("specgate_priority_wait_seconds_count", labels(tier="high"))] == TRICKLE
    assert ("specgate_priority_shed_total", labels(tier="high", reason="full")) not in samples


@pytest.mark.parametrize("value", ["urgent", "1.5", "5000"])
def test_a_priority_header_that_is_not_an_integer_in_range_is_a_400(start_gateway, std_fake, value):
    gw = start_gateway(standard_only(std_fake.url))
    with openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           extra_headers={"x-specgate-priority": value})
    assert bad.value.body["param"] == "x-specgate-priority"
    assert "-1000 to 1000" in bad.value.message
    assert std_fake.completion_requests() == []


def test_a_pool_whose_backends_report_a_long_queue_sheds_low_priorities_and_serves_high(start_gateway, std_fake):
    gw = start_gateway(standard_only(std_fake.url, max_in_flight=8,
                                     priority={"shed_below": 0, "busy_load": 16}))
    runtime = gw.app.state.runtime
    with openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client:
        def ask_at(priority: int):
            return client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": f"at {priority}"}], max_tokens=4,
                extra_headers={"x-specgate-priority": str(priority)})

        assert ask_at(-1).status_code == 200  # not busy: every priority goes through
        runtime.reported.publish({"standard": 40})  # the backends report 40 running + waiting
        with pytest.raises(openai.RateLimitError) as shed:
            ask_at(-1)
        served = ask_at(0)
        runtime.reported.publish({"standard": 3})
        assert ask_at(-5).status_code == 200
    assert served.status_code == 200 and served.headers["x-specgate-pool"] == "standard"
    assert shed.value.code == "rate_limit_exceeded" and shed.value.response.headers["retry-after"] == "5"
    assert "shed requests of priority -1" in shed.value.message
    assert [r.body["messages"][0]["content"] for r in std_fake.completion_requests()] == ["at -1", "at 0", "at -5"]
