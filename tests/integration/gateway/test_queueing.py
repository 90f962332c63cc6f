"""A burst larger than a pool's in-flight limit waits in the gateway's queue
and is served; beyond the queue's bound the answer is 429 with Retry-After.
Real servers on 127.0.0.1, the official openai client."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from gateway.upstream.pools import Pool

from .conftest import policy_dict

MESSAGES = [{"role": "user", "content": "Tell me about rivers."}]


def standard_only(url: str, **pool_options) -> dict:
    return {**policy_dict([url], [url], **pool_options), "rules": [{"name": "all", "route": "standard"}]}


async def queued(pool: Pool, count: int, sent: list[asyncio.Task[Any]]) -> None:
    """Until `count` requests wait in the gateway (served on another thread),
    or one of those `sent` has its answer already (then the count is wrong)."""
    while pool.queue.waiting < count and not any(task.done() for task in sent):
        await asyncio.sleep(0.01)
    assert pool.queue.waiting == count, [task.exception() for task in sent if task.done()]


def ask(client: openai.AsyncOpenAI):
    return client.chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=64)


def test_a_burst_over_max_in_flight_waits_and_completes_without_a_503(start_gateway, std_fake):
    gw = start_gateway(standard_only(std_fake.url, max_in_flight=2))
    pool = gw.app.state.runtime.pools["standard"]
    std_fake.hold()  # answers pause after their first piece: the burst piles up

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="k", max_retries=0)
        burst = [asyncio.create_task(ask(client)) for _ in range(12)]
        await queued(pool, 10, burst)  # two in flight, ten waiting
        assert pool.in_flight == 2
        std_fake.release()
        answers = await asyncio.gather(*burst)
        await client.close()
        return [a.choices[0].finish_reason for a in answers]

    try:
        assert asyncio.run(main()) == ["stop"] * 12
    finally:
        std_fake.release()
    assert len(std_fake.completion_requests()) == 12
    assert (pool.in_flight, pool.queue.waiting, pool.queue.handed) == (0, 0, 0)


def test_beyond_the_queue_bound_the_answer_is_429_with_retry_after(start_gateway, std_fake):
    gw = start_gateway(standard_only(std_fake.url, max_in_flight=1, queue={"max_waiting": 2}))
    pool = gw.app.state.runtime.pools["standard"]
    std_fake.hold()

    async def main() -> openai.APIStatusError:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="k", max_retries=0)
        held = [asyncio.create_task(ask(client)) for _ in range(3)]
        await queued(pool, 2, held)
        with pytest.raises(openai.APIStatusError) as refused:
            await ask(client)
        std_fake.release()
        await asyncio.gather(*held)  # the queued ones are still served
        await client.close()
        return refused.value

    try:
        error = asyncio.run(main())
    finally:
        std_fake.release()
    assert error.status_code == 429
    assert error.response.headers["retry-after"] == "5"  # the pool's first_byte_s bounds the wait
    assert error.code == "rate_limit_exceeded"
    assert "queues are full" in error.message


def test_a_client_that_leaves_while_queued_leaves_no_waiter_and_the_next_is_served(start_gateway, std_fake):
    gw = start_gateway(standard_only(std_fake.url, max_in_flight=1))
    pool = gw.app.state.runtime.pools["standard"]
    std_fake.hold()

    async def main() -> str | None:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="k", max_retries=0)
        held = asyncio.create_task(ask(client))
        # `held` takes the one slot first: sent at the same moment, either one could
        while not pool.in_flight and not held.done():
            await asyncio.sleep(0.01)
        leaving = asyncio.create_task(ask(client))
        await queued(pool, 1, [held, leaving])
        leaving.cancel()  # the client closes its connection
        while pool.queue.waiting:
            await asyncio.sleep(0.01)
        std_fake.release()
        await held
        answer = await ask(client)
        await client.close()
        return answer.choices[0].finish_reason

    try:
        assert asyncio.run(main()) == "stop"
    finally:
        std_fake.release()
    assert len(std_fake.completion_requests()) == 2  # the one that left never reached the backend
    assert (pool.in_flight, pool.queue.waiting, pool.queue.handed) == (0, 0, 0)
