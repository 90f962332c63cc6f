"""Play a trace's conversations through a gateway and measure each turn.

Every turn is a streamed chat completion at temperature 0; its time to first
token is from sending the request to the first event with text. The answer's
text goes into the next turn's messages, as a chat client does. The backends'
own counters are read before and after (`BackendCounters`): prefix-cache hits
and queries, and each replica's finished requests and the sum of their
latencies, whose delta over the run's wall time is the mean number of
requests in flight there (Little's law).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
from tqdm import tqdm

from bench.affinity.trace import Conversation

COUNTERS = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_sum",
)


@dataclass(frozen=True)
class Turn:
    conversation: int
    system_id: int
    turn: int  # 1 for the first
    ok: bool
    ttft_s: float | None
    error: str = ""


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The `COUNTERS` of one backend, summed over their label sets."""
    text = (await client.get(url + "/metrics")).text
    values = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values


async def ask(client: httpx.AsyncClient, url: str, body: dict[str, Any],
              headers: dict[str, str]) -> tuple[float | None, str, str]:  # fmt: skip
    """Stream one chat completion: (seconds to the first text, the answer, an error or "")."""
    sent, first, parts = time.perf_counter(), None, []
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                return None, "", f"http_{response.status_code}: {(await response.aread())[:200]!r}"
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return first, "".join(parts), f"error event: {event['error']}"
                for choice in event.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content") or ""
                    if text and first is None:
                        first = time.perf_counter() - sent
                    parts.append(text)
    except httpx.HTTPError as exc:
        return first, "".join(parts), type(exc).__name__
    return first, "".join(parts), ""


@dataclass
class Player:
    """Plays conversations against `url` (the gateway), `max_tokens` an answer."""

    url: str
    model: str
    max_tokens: int
    headers: dict[str, str]
    session_header: str | None = None

    async def converse(self, client: httpx.AsyncClient, conv: Conversation, started: float,
                       turns: list[Turn], bar: tqdm) -> None:  # fmt: skip
        await asyncio.sleep(max(0.0, started + conv.start_s - time.monotonic()))
        messages: list[dict[str, str]] = [{"role": "system", "content": conv.system}]
        headers = dict(self.headers)
        if self.session_header:
            headers[self.session_header] = f"conversation-{conv.id}"
        for number, (user, think) in enumerate(zip(conv.turns, conv.think_s, strict=True), 1):
            messages.append({"role": "user", "content": user})
            body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                    "temperature": 0.0, "stream": True}  # fmt: skip
            ttft, answer, error = await ask(client, self.url, body, headers)
            turns.append(Turn(conv.id, conv.system_id, number, not error, ttft, error))
            bar.update(1)
            if error:
                bar.update(len(conv.turns) - number)  # the rest of the conversation is not played
                return
            messages.append({"role": "assistant", "content": answer})
            await asyncio.sleep(think)


async def play(player: Player, conversations: list[Conversation], backends: list[str], label: str,
               concurrency: int | None = None) -> tuple[list[Turn], list[dict[str, float]], float]:
    """Every conversation played (at most `concurrency` at once when given); the turns, each
    backend's counter deltas and the wall time."""
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=600, trust_env=False, limits=limits) as client:
        before = [await scrape(client, url) for url in backends]
        turns: list[Turn] = []
        gate = asyncio.Semaphore(concurrency or len(conversations) or 1)
        bar = tqdm(total=sum(len(c.turns) for c in conversations), desc=label, unit="turn", leave=False, mininterval=5)
        started = time.monotonic()

        async def one(conv: Conversation) -> None:
            async with gate:
                await player.converse(client, conv, started, turns, bar)

        await asyncio.gather(*(one(conv) for conv in conversations))
        wall = time.monotonic() - started
        bar.close()
        after = [await scrape(client, url) for url in backends]
    deltas = [{name: b[name] - a[name] for name in COUNTERS} for a, b in zip(before, after, strict=True)]
    return turns, deltas, wall
