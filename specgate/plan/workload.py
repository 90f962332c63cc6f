"""The traffic `specgate plan` sizes a fleet for: a list of timed requests.

Three sources, told apart by the file:

- a workload description (`.yaml`/`.yml`): arrival phases, a class mix and,
  optionally, the objective and each class's acceptance::

      seed: 1
      phases:                        # Poisson arrivals, one rate per phase
        - {duration_s: 30, rate: 2}
        - {duration_s: 30, rate: 8}
      classes:                       # drawn by share
        - {domain: code, temperature: 0, max_tokens: 256, share: 3}
        - {domain: chat, temperature: 1.5, max_tokens: 512, share: 1, acceptance: 0.3}
      slo: {ttft_s: 1.0, tpot_s: 0.05}

  `domain` is code, math or chat; `prompt_tokens` (default 200) is the
  prompt's length; `acceptance`, when given, replaces the simulator's
  per-token acceptance for that class (what the gateway measured).
- a routing-benchmark trace (`.jsonl` rows with `at`, as bench/routing/traces.py
  writes): each request's time, domain, temperature and max_tokens; a control
  row's `domain_quality` scales the acceptance of later arrivals.
- the gateway's prompt capture (`.jsonl` rows with `time` and `class`, e.g.
  `code/greedy`): times to the second, the class's domain and a temperature
  standing for its bucket, the default answer length.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from backends.serving.generation import estimate_tokens

DOMAINS = ("code", "math", "chat")
BUCKET_TEMPERATURE = {"greedy": 0.0, "low": 0.3, "mid": 0.8, "hot": 1.3}  # a temperature inside each bucket
MAX_REQUESTS = 100_000  # each option is replayed over every request: ~1 s a thousand on two replicas


class WorkloadError(ValueError):
    """A workload file that cannot be read, with where and why."""


@dataclass(frozen=True)
class PlannedRequest:
    at: float
    domain: str
    temperature: float
    max_tokens: int | None
    prompt_tokens: int
    acceptance: float | None = None  # the class's measured acceptance, if given
    quality: float = 1.0  # the draft's quality for this domain when it arrives


@dataclass
class Workload:
    name: str
    requests: list[PlannedRequest]
    slo: dict[str, float] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        times = [r.at for r in self.requests]
        return max(1.0, max(times) - min(times)) if times else 1.0


def load(path: Path) -> Workload:
    if not path.is_file():
        raise WorkloadError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        workload = _described(path.stem, _yaml(path, text))
    else:
        workload = Workload(path.stem, _rows(path, text))
    if not workload.requests:
        raise WorkloadError(f"{path}: no requests")
    return workload


def _yaml(path: Path, text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WorkloadError(f"{path}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}: a workload is a mapping with phases and classes")
    return data


def _described(name: str, data: dict[str, Any]) -> Workload:
    rng = random.Random(_number(data, "seed", 1, minimum=0))
    classes = [_class(index, spec) for index, spec in enumerate(_list(data, "classes"))]
    weights = [spec["share"] for spec in classes]
    requests: list[PlannedRequest] = []
    start = 0.0
    for index, phase in enumerate(_list(data, "phases")):
        if not isinstance(phase, dict):
            raise WorkloadError(f"phases[{index}]: a phase is {{duration_s, rate}}")
        duration = _number(phase, "duration_s", None, minimum=1e-9, where=f"phases[{index}]")
        rate = _number(phase, "rate", None, minimum=0, where=f"phases[{index}]")
        now = start
        while rate > 0:
            now += rng.expovariate(rate)
            if now >= start + duration:
                break
            spec = rng.choices(classes, weights)[0]
            _room_for_one_more(requests)
            requests.append(PlannedRequest(now, spec["domain"], spec["temperature"], spec["max_tokens"],
                                           spec["prompt_tokens"], spec["acceptance"]))
        start += duration
    return Workload(name, requests, _slo(data.get("slo")))


def _class(index: int, spec: Any) -> dict[str, Any]:
    where = f"classes[{index}]"
    if not isinstance(spec, dict):
        raise WorkloadError(f"{where}: a class is a mapping (domain, temperature, max_tokens, share)")
    domain = spec.get("domain", "chat")
    if domain not in DOMAINS:
        raise WorkloadError(f"{where}: domain must be one of {', '.join(DOMAINS)}, not {domain!r}")
    acceptance = spec.get("acceptance")
    if acceptance is not None:
        acceptance = _number(spec, "acceptance", None, minimum=0, where=where)
        if acceptance >= 1:
            raise WorkloadError(f"{where}: acceptance is a per-token probability below 1")
    max_tokens = spec.get("max_tokens")
    return {"domain": domain, "temperature": _number(spec, "temperature", 0.0, minimum=0, where=where),
            "max_tokens": None if max_tokens is None else int(_number(spec, "max_tokens", None, 1, where)),
            "prompt_tokens": int(_number(spec, "prompt_tokens", 200, minimum=1, where=where)),
            "share": _number(spec, "share", 1.0, minimum=1e-12, where=where), "acceptance": acceptance}


def _slo(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - {"ttft_s", "tpot_s"}:
        raise WorkloadError("slo: expected {ttft_s, tpot_s}")
    return {key: _number(value, key, None, minimum=1e-9, where="slo") for key in value}


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise WorkloadError(f"{key}: a non-empty list is required")
    return value


def _number(data: dict[str, Any], key: str, default: float | None, minimum: float, where: str = "",
            maximum: float = math.inf) -> float:
    value = data.get(key)
    value = default if value is None else value
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or not minimum <= value <= maximum):
        place = f"{where}." if where else ""
        bound = f" and <= {maximum}" if maximum < math.inf else ""
        raise WorkloadError(f"{place}{key}: a number >= {minimum}{bound} is required, not {value!r}")
    return float(value)


def _room_for_one_more(requests: list[PlannedRequest]) -> None:
    if len(requests) >= MAX_REQUESTS:
        raise WorkloadError(f"more than {MAX_REQUESTS} requests: plan a part of the workload "
                            "(each option is replayed over every request)")


def _rows(path: Path, text: str) -> list[PlannedRequest]:
    requests: list[PlannedRequest] = []
    quality: dict[str, float] = {}
    start: datetime | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            _room_for_one_more(requests)
            if "control" in row:
                changes = row["control"].get("domain_quality", {})
                quality.update({domain: _number(changes, domain, None, 0, "domain_quality") for domain in changes})
            elif "at" in row:
                requests.append(_traced(row, quality))
            else:
                when = datetime.fromisoformat(row["time"].replace("Z", "+00:00"))
                start = start or when
                requests.append(_captured(row, (when - start).total_seconds()))
        except WorkloadError as exc:
            raise WorkloadError(f"{path}:{number}: {exc}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WorkloadError(f"{path}:{number}: not a trace or capture row ({exc})") from None
    return _spread(sorted(requests, key=lambda r: r.at))


def _traced(row: dict[str, Any], quality: dict[str, float]) -> PlannedRequest:
    domain = row.get("domain") if row.get("domain") in DOMAINS else "chat"
    text = _messages_text(row) or str(row.get("prompt", ""))
    max_tokens = None if row.get("max_tokens") is None else int(_number(row, "max_tokens", None, 1))
    return PlannedRequest(_number(row, "at", None, 0), domain, _number(row, "temperature", 0.0, 0, maximum=2),
                          max_tokens, estimate_tokens(text), quality=quality.get(domain, 1.0))


def _messages_text(row: dict[str, Any]) -> str:
    messages = row.get("messages") or []
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise WorkloadError("messages: a list of {role, content} objects is required")
    return "\n".join(str(m.get("content", "")) for m in messages)


def _captured(row: dict[str, Any], at: float) -> PlannedRequest:
    domain, _, bucket = str(row["class"]).partition("/")
    text = _messages_text(row)
    return PlannedRequest(at, domain if domain in DOMAINS else "chat", BUCKET_TEMPERATURE.get(bucket, 1.0), None,
                          estimate_tokens(text))


def _spread(requests: list[PlannedRequest]) -> list[PlannedRequest]:
    """Captured times are whole seconds: spread each second's arrivals across it."""
    out: list[PlannedRequest] = []
    for at, group in itertools.groupby(requests, key=lambda r: r.at):
        same = list(group)
        if len(same) > 1 and float(at).is_integer():
            same = [dataclasses.replace(r, at=at + i / len(same)) for i, r in enumerate(same)]
        out += same
    return out
