"""Let the target answer the prompts, through any OpenAI-compatible URL.

Each answered prompt is appended to `answers.jsonl` at once, so a run that
stops (or is stopped) resumes where it was: prompts already answered there
are not asked again. Requests run `concurrency` at a time; a connection
error, a timeout, 429 or a 5xx is retried with exponential backoff, and a
prompt that still fails is counted and left for the next run.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specgate.draft.prompts import Prompt

RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Asking:
    url: str  # the OpenAI base URL, e.g. http://127.0.0.1:8000/v1
    model: str
    max_tokens: int = 512
    temperature: float = 0.0
    concurrency: int = 4
    retries: int = 4
    backoff_s: float = 0.5
    timeout_s: float = 300.0
    api_key: str | None = None


@dataclass
class Tally:
    answered: int = 0
    skipped: int = 0  # answered by an earlier run
    failed: int = 0
    retried: int = 0
    errors: dict[str, int] = field(default_factory=dict)


def answered(path: Path) -> dict[str, str]:
    """id -> answer from an answers file (a torn last line is ignored)."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
            out[str(data["id"])] = str(data["answer"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return out


async def regenerate(prompts: Sequence[Prompt], asking: Asking, answers: Path,
                     progress: Any = None, seed: int = 0) -> Tally:
    """Answer every prompt not yet in `answers`; `progress` (a tqdm bar) is advanced per prompt."""
    done = answered(answers)
    tally = Tally(skipped=sum(p.id in done for p in prompts))
    todo = [p for p in prompts if p.id not in done]
    if progress is not None:
        progress.update(tally.skipped)
    answers.parent.mkdir(parents=True, exist_ok=True)
    gate = asyncio.Semaphore(max(1, asking.concurrency))
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {asking.api_key}"} if asking.api_key else {}
    async with httpx.AsyncClient(base_url=asking.url.rstrip("/"), headers=headers, trust_env=False,
                                 timeout=asking.timeout_s) as client:
        with answers.open("a", encoding="utf-8") as out:
            if answers.stat().st_size and not answers.read_bytes().endswith(b"\n"):
                out.write("\n")  # a run killed mid-line: start on a fresh one
            async def one(prompt: Prompt) -> None:
                async with gate:
                    answer = await _ask(client, asking, prompt, tally, rng)
                if answer is None:
                    tally.failed += 1
                else:
                    out.write(json.dumps({"id": prompt.id, "answer": answer}, ensure_ascii=False) + "\n")
                    out.flush()
                    tally.answered += 1
                if progress is not None:
                    progress.update(1)

            await asyncio.gather(*(one(p) for p in todo))
    return tally


async def _ask(client: httpx.AsyncClient, asking: Asking, prompt: Prompt, tally: Tally,
               rng: random.Random) -> str | None:
    body = {"model": asking.model, "messages": prompt.as_messages(), "max_tokens": asking.max_tokens,
            "temperature": asking.temperature}
    for attempt in range(asking.retries + 1):
        if attempt:
            tally.retried += 1
            await asyncio.sleep(asking.backoff_s * 2 ** (attempt - 1) * (0.5 + rng.random()))
        try:
            response = await client.post("/chat/completions", json=body)
        except httpx.TransportError as exc:
            kind = type(exc).__name__
        else:
            if response.status_code == 200:
                return _text(response)
            kind = f"http_{response.status_code}"
            if response.status_code not in RETRYABLE:
                tally.errors[kind] = tally.errors.get(kind, 0) + 1
                return None
        tally.errors[kind] = tally.errors.get(kind, 0) + 1
    return None


def _text(response: httpx.Response) -> str | None:
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return content.strip() if isinstance(content, str) and content.strip() else None
