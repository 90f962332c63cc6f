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
- hard: 60 s of more code and more hot sampling (temperatures up to 1.8)
  than the others, ~3 requests/s with a sustained overload of ~9 requests/s
  from 20 s to 40 s, and at 30 s the drafts of a second domain degrade
  (`{"domain_quality": {"math": 0.1}}`).
- mixed: the earlier single trace (`--requests`, `--duration`): a trickle and
  two bursts, temperatures 0-1.5.
- copy-chat (`--requests`, `--duration`, for real vLLM backends): half prompts
  whose answer copies the prompt (rename a variable in a function, list a log's
  ERROR lines, quote a sentence), half open chat (a poem, a story), temperatures
  0-1, max_tokens 64-192, 80% streamed; three equal phases whose arrival rates
  are 1 : 4 : 8.

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


HARD_TEMPERATURES = (0.0, 0.0, 0.3, 1.0, 1.2, 1.5, 1.5, 1.8)
HARD_DOMAINS = ["code", "code", "code", "chat", "chat", "math", "math"]


def hard(rng: random.Random, count: int, duration_s: float) -> Trace:
    def rate(t: float) -> float:
        return 9.0 if 20.0 <= t < 40.0 else 3.0

    requests = [_request(rng, at, HARD_DOMAINS, HARD_TEMPERATURES) for at in _poisson(rng, rate, 0.0, 60.0)]
    return Trace("hard", requests, [Control(30.0, {"domain_quality": {"math": 0.1}})])


def mixed(rng: random.Random, count: int, duration_s: float) -> Trace:
    """A steady trickle plus two bursts of simultaneous arrivals."""
    arrivals = sorted(rng.uniform(0, duration_s) for _ in range(count // 2))
    for burst_at in (duration_s * 0.25, duration_s * 0.6):
        arrivals += [burst_at + rng.uniform(0, 1.0) for _ in range((count - len(arrivals)) // 2 or 1)]
    arrivals += [rng.uniform(0, duration_s) for _ in range(count - len(arrivals))]
    return Trace("mixed", _mixed_at(rng, sorted(arrivals)[:count]))


# copy-chat: prompts whose answers copy the prompt (what n-gram lookup drafts well) and open chat.
NAMES = ("count", "total", "items", "value", "result", "buffer", "index", "limit")
FUNCTIONS = (
    "def {v}_sum(values):\n    {v} = 0\n    for item in values:\n        {v} = {v} + item\n    return {v}\n",
    "def first_{v}(rows, key):\n    for {v} in rows:\n        if {v}[key] is not None:\n            return {v}[key]\n"
    "    return None\n",
    "def scale(points, {v}):\n    out = []\n    for x, y in points:\n        out.append((x * {v}, y * {v}))\n"
    "    return out\n",
)
SERVICES = ("db", "auth", "cache", "queue", "api")
EVENTS = ("connection refused", "timeout after 30s", "user login ok", "request served in 12ms",
          "disk usage at 91%", "retrying in 5s", "config reloaded", "worker restarted")
SENTENCES = ("The river floods every spring.", "Farmers plant rice after the water recedes.",
             "The old bridge was built in 1821.", "A market opens on the east bank each Sunday.",
             "Tourists come in summer to see the lanterns.", "The school has two hundred pupils.",
             "Most houses are painted white.", "A ferry still runs when the bridge is closed.")
TOPICS = ("the sea at night", "a lost umbrella", "autumn in a city", "a lighthouse keeper", "a cat on a train",
          "the first snow", "an old violin", "a desert road")
CHAT_ASKS = ("Write a short poem about {t}.", "Tell a short story about {t}.",
             "Describe {t} in a few vivid sentences.")


def _rename(rng: random.Random) -> str:
    old, new = rng.sample(NAMES, 2)
    code = rng.choice(FUNCTIONS).format(v=old)
    return (f"Rewrite this Python function with the variable `{old}` renamed to `{new}`. "
            f"Reply with the whole function only.\n```python\n{code}```")


def _extract(rng: random.Random) -> str:
    lines = [f"2024-05-{rng.randint(10, 28)} 10:{minute:02d}:{rng.randint(0, 59):02d} "
             f"{rng.choice(('INFO', 'INFO', 'WARN', 'ERROR'))} {rng.choice(SERVICES)}: {rng.choice(EVENTS)}"
             for minute in sorted(rng.sample(range(60), 10))]
    return "List every line of this log that contains ERROR, exactly as written.\n\n" + "\n".join(lines)


def _quote(rng: random.Random) -> str:
    chosen = rng.sample(SENTENCES, 6)
    word = rng.choice(chosen).split()[1]
    return (f"Quote, word for word, the sentence of this text that contains the word \"{word}\", "
            f"then repeat the whole text.\n\n{' '.join(chosen)}")


def _copy_chat_request(rng: random.Random, at: float) -> Request:
    if rng.random() < 0.5:
        text, domain = rng.choice((_rename, _extract, _quote))(rng), "copy"
    else:
        text, domain = rng.choice(CHAT_ASKS).format(t=rng.choice(TOPICS)), "chat"
    prompt = user(text, max_tokens=rng.randint(64, 192), temperature=rng.choice((0.0, 0.0, 0.3, 0.7, 1.0)),
                  domain=domain)
    return Request(at, prompt, rng.random() < 0.8)


def copy_chat(rng: random.Random, count: int, duration_s: float) -> Trace:
    """`count` requests over `duration_s` in three equal phases whose arrival rates are 1 : 4 : 8."""
    phase_s, shares = duration_s / 3, (1, 4, 8)
    times: list[float] = []
    for number, share in enumerate(shares):
        times += [phase_s * (number + rng.random()) for _ in range(round(count * share / sum(shares)))]
    return Trace("copy-chat", [_copy_chat_request(rng, at) for at in sorted(times)])


KINDS: dict[str, Callable[[random.Random, int, float], Trace]] = {
    "light": light, "bursty": bursty, "collapse": collapse, "shift": shift, "hard": hard, "mixed": mixed,
    "copy-chat": copy_chat,
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
