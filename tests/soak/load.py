"""A bounded asyncio load against the gateway, and the judge of every answer.

Every request ends as one outcome:

- `ok`: a complete answer (a JSON body with choices, or a stream whose last
  event is `data: [DONE]` and whose other events are JSON chunks);
- `error:STATUS:CODE`: an OpenAI error envelope with that status;
- `stream_error:CODE`: a stream that ended with an error event (envelope);
- `invalid:WHY`: anything else: a broken promise (so is an `internal_error`);
- `hang`: no answer within the client's timeout; `broken:EXC`: the connection
  to the gateway failed;
- `abandoned`: the client hung up after the first chunk of a stream, on
  purpose (the gateway must cancel the upstream request and forget it).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

PROMPT = [{"role": "user", "content": "Tell me about rivers."}]


@dataclass
class LoadReport:
    outcomes: Counter[str] = field(default_factory=Counter)
    durations: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    def violations(self) -> dict[str, int]:
        """Outcomes that break the gateway's promises; an internal_error envelope is a bug too."""
        return {k: v for k, v in self.outcomes.items()
                if k.split(":")[0] in ("invalid", "hang", "broken") or k.endswith(":internal_error")}

    def percentile(self, q: float) -> float:
        ordered = sorted(self.durations)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def judge(stream: bool, status: int, content_type: str, body: bytes) -> str:
    """The outcome label of one answer (see the module docstring)."""
    if content_type.startswith("text/event-stream"):
        return _judge_stream(body) if stream and status == 200 else "invalid:unexpected_stream"
    try:
        payload = json.loads(body)
    except ValueError:
        return f"invalid:not_json_{status}"
    if status == 200:
        choices = payload.get("choices") if isinstance(payload, dict) else None
        return "ok" if isinstance(choices, list) and choices else "invalid:no_choices"
    return _envelope_label(payload, f"error:{status}")


def _judge_stream(body: bytes) -> str:
    events = [e for e in body.decode("utf-8", "replace").split("\n\n") if e.strip()]
    data = [line[len("data: "):] for event in events for line in event.splitlines()
            if line.startswith("data: ")]
    if not data:
        return "invalid:empty_stream"
    *chunks, last = data
    for chunk in chunks:
        try:
            if "choices" not in json.loads(chunk):
                return "invalid:chunk_without_choices"
        except ValueError:
            return "invalid:chunk_not_json"
    if last == "[DONE]":
        return "ok"
    try:
        return _envelope_label(json.loads(last), "stream_error")
    except ValueError:
        return "invalid:stream_not_finished"


def _envelope_label(payload: Any, prefix: str) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) \
            or not isinstance(error.get("type"), str) or not {"param", "code"} <= error.keys():
        return f"invalid:not_an_envelope_{prefix}"
    return f"{prefix}:{error['code'] if error['code'] is not None else error['type']}"


@dataclass(frozen=True)
class Call:
    path: str
    body: dict[str, Any]
    abandon: bool = False  # hang up after the first chunk


def request_mix(rng: random.Random, abandon_rate: float = 0.0) -> Call:
    """Half streamed; some hot sampling (the standard pool), the rest speculative;
    `abandon_rate` of the streams are dropped by the client after their first chunk."""
    stream = rng.random() < 0.5
    temperature = 1.5 if rng.random() < 0.4 else 0.7
    if rng.random() < 0.8:
        path, body = "/v1/chat/completions", {"messages": PROMPT}
    else:
        path, body = "/v1/completions", {"prompt": "Tell me about rivers."}
    return Call(path, {"model": "fake-model", "stream": stream, "temperature": temperature,
                       "max_tokens": 64, **body}, abandon=stream and rng.random() < abandon_rate)


async def run_load(base_url: str, total: int, concurrency: int, timeout_s: float,
                   seed: int = 0, abandon_rate: float = 0.0) -> LoadReport:
    """Send `total` requests with `concurrency` workers; every request has `timeout_s`."""
    report = LoadReport()
    rng = random.Random(seed)
    mix = [request_mix(rng, abandon_rate) for _ in range(total)]
    next_index = iter(range(total))
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    started = time.perf_counter()
    async with aiohttp.ClientSession(base_url, connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            for index in next_index:
                began = time.perf_counter()
                report.outcomes[await _one(session, mix[index])] += 1
                report.durations.append(time.perf_counter() - began)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    report.elapsed_s = time.perf_counter() - started
    return report


async def _one(session: aiohttp.ClientSession, call: Call) -> str:
    try:
        async with session.post(call.path, json=call.body) as response:
            if call.abandon and response.status == 200:
                await response.content.readany()
                response.close()  # drops the connection
                return "abandoned"
            content = await response.read()
            return judge(call.body["stream"], response.status, response.headers.get("content-type", ""),
                         content)
    except asyncio.TimeoutError:
        return "hang"
    except aiohttp.ClientError as exc:
        return f"broken:{type(exc).__name__}"
