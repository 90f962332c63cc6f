"""`Features`: what the router knows about a request, the values a rule's
`when:` reads (gateway/policy/conditions.py), and `Defaults`, the policy's
values for what a request leaves out.

Pure data: reading them from a request body is gateway/decide/features.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

NO_LOAD: Mapping[str, int] = MappingProxyType({})


class Features(NamedTuple):
    """Immutable, and a tuple rather than a frozen dataclass: one is built per request,
    and a frozen dataclass's `__init__` costs four times as much."""

    endpoint: str  # "chat", "completions", "messages" or "responses" (gateway.decide.apis)
    model: str | None
    temperature: float
    top_p: float
    max_tokens: int
    stream: bool
    n: int
    prompt_chars: int
    prompt_tokens: int
    tools: bool
    response_format: bool
    logprobs: bool
    domain: str
    route: str | None = None  # pool asked for by x-specgate-route (when allowed)
    load: Mapping[str, int] = NO_LOAD

    def value(self, name: str) -> Any:
        if name.startswith("load."):
            return self.load.get(name.removeprefix("load."), 0)
        return getattr(self, name)

    def to_json(self) -> dict[str, Any]:
        data = self._asdict()
        data["load"] = dict(self.load)
        return data


FEATURE_NAMES: tuple[str, ...] = tuple(name for name in Features._fields if name != "load")


@dataclass(frozen=True, slots=True)
class Defaults:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
