"""Timing one streamed request, and the statistics over many.

TTFT is the time to the first content token; TPOT the time per output token
after it, (E2E - TTFT) / (tokens - 1); tokens come from the usage the server
reports (`stream_options.include_usage`), else from content chunks.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from specgate.ops.prompts import Prompt


@dataclass
class Sample:
    target: str
    concurrency: int
    ok: bool
    e2e_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens: int = 0
    pool: str | None = None
    domain: str = "chat"
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def timed_request(client: httpx.AsyncClient, url: str, prompt: Prompt, *, model: str, max_tokens: int,
                        target: str, concurrency: int, stream: bool = True) -> Sample:
    body = prompt.body(model, max_tokens, stream)
    started = time.perf_counter()
    first: float | None = None
    chunks = usage_tokens = 0
    try:
        async with client.stream("POST", url.rstrip("/") + prompt.path, json=body) as response:
            pool = response.headers.get("x-specgate-pool")
            if response.status_code != 200:
                await response.aread()
                return Sample(target, concurrency, False, time.perf_counter() - started, pool=pool,
                              domain=prompt.domain, error=f"http_{response.status_code}")
            if not stream:
                data = json.loads(await response.aread())
                first = time.perf_counter()
                usage_tokens = (data.get("usage") or {}).get("completion_tokens") or 0
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise ValueError(event["error"].get("message", "error event"))
                    if event.get("usage"):
                        usage_tokens = event["usage"].get("completion_tokens") or usage_tokens
                    if any(_content(choice) for choice in event.get("choices") or ()):
                        chunks += 1
                        first = first or time.perf_counter()
    except (httpx.HTTPError, ValueError) as exc:
        return Sample(target, concurrency, False, time.perf_counter() - started, domain=prompt.domain,
                      error=type(exc).__name__)
    end = time.perf_counter()
    tokens = usage_tokens or chunks
    ttft = None if first is None else first - started
    tpot = (end - first) / (tokens - 1) if first is not None and tokens > 1 and stream else None
    return Sample(target, concurrency, True, end - started, ttft, tpot, tokens, pool, prompt.domain)


def _content(choice: dict[str, Any]) -> str:
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(samples: Sequence[Sample], wall_s: float) -> dict[str, Any]:
    ok = [s for s in samples if s.ok]
    summary: dict[str, Any] = {"requests": len(samples), "errors": len(samples) - len(ok),
                               "requests_per_s": len(ok) / wall_s if wall_s else 0.0,
                               "output_tokens_per_s": sum(s.output_tokens for s in ok) / wall_s if wall_s else 0.0}
    for name in ("ttft_s", "tpot_s", "e2e_s"):
        values = [getattr(s, name) for s in ok if getattr(s, name) is not None]
        summary[name] = {f"p{q}": percentile(values, q) for q in (50, 95, 99)}
        summary[name]["mean"] = sum(values) / len(values) if values else None
    pools: dict[str, int] = {}
    for sample in ok:
        if sample.pool:
            pools[sample.pool] = pools.get(sample.pool, 0) + 1
    summary["pools"] = pools
    return summary
