"""The policy file's schema: `PolicySpec`, the pydantic model of the YAML, and
its top-level sections (defaults, domains, rules, overrides, routing).

A pool's section is `PoolSpec` (pools.py); the guard's, the capture's and
the routing priors' have modules of their own. Loading a file into a
checked, compiled `Policy` is loader.py.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.policy.capture import CaptureSpec
from gateway.policy.guard import GuardSpec
from gateway.policy.pools import PoolSpec
from gateway.policy.priority import HIGHEST, LOWEST
from gateway.policy.priors import PriorsSpec
from gateway.policy.strict import Strict

FASTEST = "fastest"  # the route that picks, per request, the candidate pool predicted to answer first


class DefaultsSpec(Strict):
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, ge=0, le=1)
    max_tokens: int = Field(default=256, ge=1)


class DomainSpec(Strict):
    patterns: list[str] = []
    keywords: list[str] = []

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
        return patterns


class RuleSpec(Strict):
    name: str = Field(min_length=1)
    when: dict[str, Any] | None = None
    route: str  # a pool, or `fastest`
    candidates: list[str] | None = Field(default=None, min_length=1)  # for `fastest`; else every pool
    priority: int | None = Field(default=None, ge=LOWEST, le=HIGHEST)  # of the requests it matches
    reason: str | None = None


class RoutingSpec(Strict):
    """`route: fastest` expects min(max_tokens, typical_output_tokens) tokens (docs/routing.md)."""
    typical_output_tokens: int = Field(default=256, ge=1)
    half_life_s: float = Field(default=10.0, gt=0)  # how fast measurements are forgotten
    priors: PriorsSpec = PriorsSpec()  # acceptance per class and cold step times (gateway/policy/priors.py)


class OverridesSpec(Strict):
    route_header: bool = False  # honour x-specgate-route
    domain_header: bool = False  # honour x-specgate-domain


class PolicySpec(Strict):
    version: Literal[1]
    defaults: DefaultsSpec = DefaultsSpec()
    pools: dict[str, PoolSpec] = Field(min_length=1)
    default_pool: str | None = None
    domains: dict[str, DomainSpec] = {}
    default_domain: str = "chat"
    rules: list[RuleSpec] = Field(min_length=1)
    overrides: OverridesSpec = OverridesSpec()
    routing: RoutingSpec = RoutingSpec()
    guard: GuardSpec = GuardSpec()
    capture: CaptureSpec = CaptureSpec()  # sample prompts for draft training; off by default
