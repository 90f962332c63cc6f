"""Prefix and session affinity through a running gateway: two fake vLLM
endpoints in one pool, the official client, conversations turn by turn."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.vllm import FakeVllm
from tests.integration.gateway.conftest import ADMIN_TOKEN, Gateway, policy_dict

ANSWER = "a cached answer"


@pytest.fixture
def replicas() -> Iterator[list[FakeVllm]]:
    with FakeVllm(model="upstream-std") as a, FakeVllm(model="upstream-std") as b:
        for fake in (a, b):
            fake.script(text=ANSWER, chunks=2)
        yield [a, b]


@pytest.fixture
def gateway(start_gateway, spec_fake, replicas) -> Gateway:
    policy = policy_dict([spec_fake.url], [fake.url for fake in replicas])
    policy["rules"] = [{"name": "all", "route": "standard"}]
    return start_gateway(policy)


def converse(client: openai.OpenAI, system: str, turns: int, **options: Any) -> None:
    """One conversation: each turn sends every earlier message and the answer."""
    messages: list[Any] = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}"})
        answer = client.chat.completions.create(model="m", messages=messages, max_tokens=16, **options)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})


def holders(replicas: list[FakeVllm], marker: str) -> list[int]:
    """How many requests whose messages contain `marker` each replica received."""
    return [sum(any(marker in str(m.get("content")) for m in r.body["messages"]) for r in fake.completion_requests())
            for fake in replicas]


def test_each_conversations_turns_land_on_one_endpoint(gateway, replicas):
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        for conversation in range(16):
            converse(client, f"system prompt of conversation {conversation}: " + "be brief. " * 40, turns=3)
    spread = [holders(replicas, f"conversation {c}:") for c in range(16)]
    assert all(sorted(counts) == [0, 3] for counts in spread), spread
    assert {counts.index(3) for counts in spread} == {0, 1}, "new conversations go to both endpoints"


def test_a_session_header_keeps_unrelated_prompts_on_one_endpoint(gateway, replicas):
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0,
                       default_headers={"x-specgate-session": "user-42"}) as client:
        for i in range(8):
            converse(client, f"session-marker topic {i}", turns=1)
    assert sorted(holders(replicas, "session-marker")) == [0, 8]


def test_explain_shows_the_endpoint_the_next_turn_would_take(gateway, replicas):
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        converse(client, "explained conversation", turns=1)
    home = next(fake.url for fake in replicas if fake.completion_requests())
    body = {"model": "m", "messages": [{"role": "system", "content": "explained conversation"},
                                       {"role": "user", "content": "question 0"},
                                       {"role": "assistant", "content": ANSWER},
                                       {"role": "user", "content": "question 1"}]}
    answer = httpx.post(gateway.url + "/admin/explain", json=body,
                        headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()["endpoint"]
    assert answer["endpoint"] == home and answer["reason"] == "prefix" and answer["balance"] == "prefix"
    assert answer["matched_blocks"] == 2 and answer["prompt_blocks"] == 4
    assert answer["load"] == 0 and answer["bound"] == 1


def test_a_failing_endpoint_hands_its_conversations_to_the_other(gateway, replicas):
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        converse(client, "moving conversation", turns=1)
        home = next(i for i, fake in enumerate(replicas) if fake.completion_requests())
        replicas[home].fail_next(100, status=503)
        converse(client, "moving conversation", turns=4)  # answered: retried on the other, then sent there
    other = replicas[1 - home]
    assert len(other.completion_requests()) == 4
    assert len(replicas[home].completion_requests()) <= 1 + 2  # the first turn, then at most its failures


def test_the_request_log_line_says_why_that_endpoint(gateway, capsys):
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        converse(client, "logged conversation", turns=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if " request " in line]
    assert len(lines) == 2
    assert "endpoint_why=hash" in lines[0] and "matched_blocks=0" in lines[0]
    assert "endpoint_why=prefix" in lines[1] and "matched_blocks=2" in lines[1]
