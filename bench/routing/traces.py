"""The seeded request traces the routing benchmark replays.

- light: ~3 requests/s of mixed domains and temperatures for 40 s.
- bursty: a light phase (~1.5 requests/s for 40 s) and two bursts of 100
  requests, each arriving within one second, at 12 s and 28 s.
- collapse: ~4 requests/s of mixed domains and temperatures for 60 s; at 20 s
  the simulators' draft acceptance on code prompts falls to a tenth
  (`POST /control {"domain_quality": {"code": 0.1}}`, backends/sim/server.py).
- shift: 50 s whose mix moves from code and math at temperature 0-0.3 (what
  drafts predict well) at ~2 requests/s to chat at temperature 1.0-1.5 (what
  they predict badly) at ~8 requests/s.
- mixed: the earlier single trace (`--requests`, `--duration`): a trickle and
  two bursts, temperatures 0-1.5.

A trace file holds one JSON object a line: a request (`at`, `stream`, the
prompt's fields) or a control event (`at`, `control`: the body posted to every
simulator of the way being measured).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specgate.ops.prompts import Prompt, prompt_from, user

TEXTS = {
    "chat": ["Tell me about the history of tea.", "How do I plan a week of healthy meals?",
             "What should I pack for a weekend of hiking?"],
    "code": ["Write a Python function that merges two sorted lists.\n```python\ndef merge(a, b):\n```",
             "Refactor this loop into a list comprehension:\n"
             "```python\nout = []\nfor x in xs:\n    out.append(x * 2)\n```"],
    "math": ["Solve 12 * 7 = ? and explain.", "Prove that the sum of two even numbers is even."],
}
TEMPERATURES = (0.0, 0.0, 0.3, 0.7, 1.0, 1.2, 1.5)
COLLAPSE_AT_S, COLLAPSE_DOMAIN, COLLAPSE_FACTOR = 20.0, "code", 0.1


@dataclass(frozen=True)
class Request:
    at: float  # seconds from the start of the replay
    prompt: Prompt
    stream: bool


@dataclass(frozen=True)
class Control:
    at: float
    body: dict[str, Any]


@dataclass
class Trace:
    name: str
    requests: list[Request] = field(default_factory=list)
    controls: list[Control] = field(default_factory=list)


def _poisson(rng: random.Random, rate: Callable[[float], float], start: float, end: float) -> list[float]:
    """Arrival times of a Poisson process whose rate (per second) may vary with time (thinning)."""
    peak = max(rate(start + (end - start) * i / 100) for i in range(101))
    times: list[float] = []
    now = start
    while True:
        now += rng.expovariate(peak)
        if now >= end:
            return times
        if rng.random() < rate(now) / peak:
            times.append(now)


def _request(rng: random.Random, at: float, domains: list[str], temperatures: tuple[float, ...]) -> Request:
    domain = rng.choice(domains)
    max_tokens = int(round(2 ** rng.uniform(4, 10)))  # 16 .. 1024, log-uniform
    prompt = user(rng.choice(TEXTS[domain]), max_tokens=max_tokens, temperature=rng.choice(temperatures),
                  domain=domain)
    return Request(at, prompt, rng.random() < 0.7)


def _mixed_at(rng: random.Random, times: list[float]) -> list[Request]:
    return [_request(rng, at, list(TEXTS), TEMPERATURES) for at in times]


def light(rng: random.Random, count: int, duration_s: float) -> Trace:
    return Trace("light", _mixed_at(rng, _poisson(rng, lambda t: 3.0, 0.0, 40.0)))


def bursty(rng: random.Random, count: int, duration_s: float) -> Trace:
    times = _poisson(rng, lambda t: 1.5, 0.0, 40.0)
    for burst_at in (12.0, 28.0):
        times += [burst_at + rng.uniform(0, 1.0) for _ in range(100)]
    return Trace("bursty", _mixed_at(rng, sorted(times)))


def collapse(rng: random.Random, count: int, duration_s: float) -> Trace:
    body = {"domain_quality": {COLLAPSE_DOMAIN: COLLAPSE_FACTOR}}
    return Trace("collapse", _mixed_at(rng, _poisson(rng, lambda t: 4.0, 0.0, 60.0)),
                 [Control(COLLAPSE_AT_S, body)])


def shift(rng: random.Random, count: int, duration_s: float) -> Trace:
    requests = []
    for at in _poisson(rng, lambda t: 2.0 + 6.0 * t / 50.0, 0.0, 50.0):
        if rng.random() < 1.0 - at / 50.0:
            requests.append(_request(rng, at, ["code", "math"], (0.0, 0.3)))
        else:
            requests.append(_request(rng, at, ["chat"], (1.0, 1.2, 1.5)))
    return Trace("shift", requests)


def mixed(rng: random.Random, count: int, duration_s: float) -> Trace:
    """A steady trickle plus two bursts of simultaneous arrivals."""
    arrivals = sorted(rng.uniform(0, duration_s) for _ in range(count // 2))
    for burst_at in (duration_s * 0.25, duration_s * 0.6):
        arrivals += [burst_at + rng.uniform(0, 1.0) for _ in range((count - len(arrivals)) // 2 or 1)]
    arrivals += [rng.uniform(0, duration_s) for _ in range(count - len(arrivals))]
    return Trace("mixed", _mixed_at(rng, sorted(arrivals)[:count]))


KINDS: dict[str, Callable[[random.Random, int, float], Trace]] = {
    "light": light, "bursty": bursty, "collapse": collapse, "shift": shift, "mixed": mixed,
}


def make(kind: str, seed: int, count: int = 240, duration_s: float = 60.0) -> Trace:
    return KINDS[kind](random.Random(seed), count, duration_s)


def write(trace: Trace, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[float, dict[str, Any]]] = [
        (r.at, {"at": r.at, "stream": r.stream, "messages": list(r.prompt.messages),
                "max_tokens": r.prompt.max_tokens, "temperature": r.prompt.temperature,
                "domain": r.prompt.domain}) for r in trace.requests]
    rows += [(c.at, {"at": c.at, "control": c.body}) for c in trace.controls]
    with path.open("w", encoding="utf-8") as out:
        for _, row in sorted(rows, key=lambda item: item[0]):
            out.write(json.dumps(row) + "\n")


def read(path: Path) -> Trace:
    trace = Trace(path.stem)
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "control" in row:
            trace.controls.append(Control(row["at"], row["control"]))
        else:
            trace.requests.append(Request(row["at"], prompt_from(row), row["stream"]))
    return trace
