"""`Features`: what the router knows about a request, the values a rule's
`when:` reads (gateway/policy/conditions.py), and `Defaults`, the policy's
values for what a request leaves out.

Pure data: reading them from a request body is gateway/decide/features.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

NO_LOAD: Mapping[str, int] = MappingProxyType({})


class Features:
    """What the router knows about a request; never changed once built. A plain class, its
    `__init__` written out and compiled with the request path (specgate/compiled.py): one is built
    per request, and a named tuple's `__new__` or a dataclass's `__init__` is interpreted Python."""

    __slots__ = ("endpoint", "model", "temperature", "top_p", "max_tokens", "stream", "n", "prompt_chars",
                 "prompt_tokens", "tools", "response_format", "logprobs", "domain", "route", "load")

    def __init__(self, endpoint: str, model: str | None, temperature: float, top_p: float, max_tokens: int,
                 stream: bool, n: int, prompt_chars: int, prompt_tokens: int, tools: bool, response_format: bool,
                 logprobs: bool, domain: str, route: str | None = None, load: Mapping[str, int] = NO_LOAD) -> None:
        self.endpoint = endpoint  # "chat", "completions", "messages" or "responses" (gateway.decide.apis)
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.stream = stream
        self.n = n
        self.prompt_chars = prompt_chars
        self.prompt_tokens = prompt_tokens
        self.tools = tools
        self.response_format = response_format
        self.logprobs = logprobs
        self.domain = domain
        self.route = route  # pool asked for by x-specgate-route (when allowed)
        self.load = load

    def value(self, name: str) -> Any:
        if name.startswith("load."):
            return self.load.get(name.removeprefix("load."), 0)
        return getattr(self, name)

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in FEATURE_NAMES}
        data["load"] = dict(self.load)
        return data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Features) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, name) for name in FEATURE_NAMES))

    def __repr__(self) -> str:
        return f"Features({self.to_json()!r})"


# The names a rule's `when:` may read, in the fields' order; `load` is read as `load.<pool>`
FEATURE_NAMES: tuple[str, ...] = ("endpoint", "model", "temperature", "top_p", "max_tokens", "stream", "n",
                                  "prompt_chars", "prompt_tokens", "tools", "response_format", "logprobs", "domain",
                                  "route")


@dataclass(frozen=True, slots=True)
class Defaults:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
