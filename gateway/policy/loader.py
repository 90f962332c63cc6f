"""The routing policy: pydantic models of the YAML file and `load_policy`.

Every mistake is reported with the file and line it sits on
(`policies/x.yaml:12: rules[2].route: unknown pool 'fast'`); an unknown key is
an error, never ignored. A loaded `Policy` also carries what the hot path
needs precompiled: the domain classifier and the rule predicates.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from domains.classifier import DomainClassifier, DomainRule
from gateway.policy.balance import Balanced
from gateway.policy.capture import CaptureSpec
from gateway.policy.conditions import ConditionError, Predicate, compile_condition
from gateway.policy.features import Defaults
from gateway.policy.guard import GuardSpec
from gateway.policy.kinds import KINDS, PoolKind, Schedule, check_schedule, schedule_of
from gateway.policy.pacing import PacingSpec
from gateway.policy.priority import HIGHEST, LOWEST, PrioritySpec
from gateway.policy.priors import PriorsSpec, SloSpec
from gateway.policy.yaml_lines import YamlError, load_with_lines, read_text


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DefaultsSpec(Strict):
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, ge=0, le=1)
    max_tokens: int = Field(default=256, ge=1)


class EndpointSpec(Strict):
    url: str
    weight: float = Field(default=1.0, gt=0)
    max_in_flight: int | None = Field(default=None, ge=1)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"endpoint url must start with http:// or https://, got {url!r}")
        return url.rstrip("/")


class TimeoutsSpec(Strict):
    connect_s: float = Field(default=5.0, gt=0)
    first_byte_s: float = Field(default=120.0, gt=0)
    total_s: float = Field(default=600.0, gt=0)
    idle_s: float = Field(default=60.0, gt=0)  # a stream's silence between chunks, after the first


class ConnectionsSpec(Strict):
    max_connections: int = Field(default=512, ge=1)
    max_keepalive: int = Field(default=128, ge=0)
    keepalive_expiry_s: float = Field(default=4.0, gt=0)  # under uvicorn's 5 s server default


class RetrySpec(Strict):
    attempts: int = Field(default=3, ge=1, le=10)  # tries in all, the first included
    budget_ratio: float = Field(default=0.2, ge=0, le=1)  # retries allowed per request sent, over a window


class HealthSpec(Strict):
    path: str = "/health"
    interval_s: float = Field(default=5.0, gt=0)
    eject_after: int = Field(default=3, ge=1)  # consecutive failures
    backoff_s: float = Field(default=2.0, gt=0)
    max_backoff_s: float = Field(default=60.0, gt=0)


class QueueSpec(Strict):
    """Waiting for a slot while the chain is full; unset, see `queue_limits` (upstream/pools.py)."""
    max_waiting: int | None = Field(default=None, ge=0)
    max_wait_s: float | None = Field(default=None, gt=0)


class PoolSpec(Balanced):  # Strict, with `balance` and `affinity` (balance_spec.py)
    kind: PoolKind  # its row in gateway/policy/kinds.py
    speculation_schedule: list[list[int]] | None = None  # dynamic: [[lo, hi, k], ...] by batch size
    slo: SloSpec = SloSpec()  # the objective admission keeps its running requests within
    endpoints: list[EndpointSpec] = Field(min_length=1)
    model: str | None = None  # upstream model name the client's model is rewritten to
    fallback: str | None = None
    max_in_flight: int | None = Field(default=None, ge=1)  # per endpoint, unless the endpoint says
    max_model_len: int | None = Field(default=None, ge=1)  # context length: bounds a request's max_tokens
    dialect: Literal["vllm", "sglang"] = "vllm"
    api_key: str | None = None  # "os.environ/NAME"
    timeouts: TimeoutsSpec = TimeoutsSpec()
    connections: ConnectionsSpec = ConnectionsSpec()
    retry: RetrySpec = RetrySpec()
    health: HealthSpec = HealthSpec()
    queue: QueueSpec = QueueSpec()
    pacing: PacingSpec = PacingSpec()  # split and space a stream's multi-token events
    priority: PrioritySpec = PrioritySpec()  # shed low priorities while saturated

    @field_validator("api_key")
    @classmethod
    def _env_reference(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"os\.environ/[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError("api_key must reference the environment as os.environ/NAME; "
                             "keys are never written in the policy")
        return value

    @model_validator(mode="after")
    def _schedule(self) -> PoolSpec:
        declares = KINDS[self.kind].declares_schedule
        if declares and not self.speculation_schedule:
            raise ValueError(f"a {self.kind} pool states its speculation_schedule: [[lo, hi, k], ...]")
        if not declares and self.speculation_schedule is not None:
            raise ValueError(f"speculation_schedule goes with kind: dynamic, not {self.kind}")
        problems = check_schedule(self.speculation_schedule or [])
        if problems:
            raise ValueError("speculation_schedule: " + "; ".join(problems))
        return self

    def upstream_api_key(self) -> str | None:
        return None if self.api_key is None else os.environ.get(self.api_key.removeprefix("os.environ/"))


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


FASTEST = "fastest"  # the route that picks, per request, the candidate pool predicted to answer first


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


class PolicyError(ValueError):
    """One or more problems, each `path:line: message`."""

    def __init__(self, path: str, problems: list[tuple[int, str]]) -> None:
        self.path = path
        self.problems = sorted(problems)
        super().__init__("\n".join(f"{path}:{line}: {msg}" for line, msg in self.problems))


@dataclass(frozen=True)
class CompiledRule:
    name: str
    route: str  # a pool, or FASTEST
    reason: str
    matches: Predicate | None  # None: always
    candidates: tuple[str, ...] = ()  # FASTEST's pools to choose from, in the policy's order


@dataclass(frozen=True)
class Policy:
    spec: PolicySpec
    source: str
    rules: tuple[CompiledRule, ...]
    classifier: DomainClassifier

    @property
    def pools(self) -> dict[str, PoolSpec]:
        return self.spec.pools

    @property
    def default_pool(self) -> str:
        return self.spec.default_pool or next(iter(self.standard_pools), next(iter(self.pools)))

    def fallback_chain(self, pool: str) -> tuple[str, ...]:
        """`pool` and the pools tried after it, in order."""
        return self._fallback_chains[pool]

    def baseline_pool(self, pool: str) -> str | None:
        """The standard pool `pool`'s latency is compared with: the pool it falls
        back to when that one is standard, else the policy's first standard pool."""
        chain = self.fallback_chain(pool)
        if len(chain) > 1 and chain[1] in self.standard_pools:
            return chain[1]
        return next(iter(self.standard_pools), None)

    @cached_property
    def schedules(self) -> dict[str, Schedule]:
        """How each pool drafts by batch size, from its kind's row."""
        k = self.spec.routing.priors.draft_tokens
        return {name: schedule_of(pool.kind, k, pool.speculation_schedule) for name, pool in self.pools.items()}

    @cached_property
    def speculative_pools(self) -> tuple[str, ...]:
        """The pools whose kind drafts and reports acceptance, in the policy's order: the ones the guard watches."""
        return tuple(name for name, pool in self.pools.items() if KINDS[pool.kind].reports_acceptance)

    @cached_property
    def standard_pools(self) -> tuple[str, ...]:
        """The pools that never draft, in the policy's order."""
        return tuple(name for name, schedule in self.schedules.items() if not schedule.ever_drafts)

    @cached_property
    def _fallback_chains(self) -> dict[str, tuple[str, ...]]:
        return {name: _walk(self.pools, name) for name in self.pools}

    @cached_property
    def defaults(self) -> Defaults:
        d = self.spec.defaults
        return Defaults(temperature=d.temperature, top_p=d.top_p, max_tokens=d.max_tokens)


def load_policy(path: str | os.PathLike[str]) -> Policy:
    path = str(path)
    try:
        text = read_text(path)  # bounded: a huge file is refused without being read whole
    except (OSError, ValueError) as exc:  # YamlError and UnicodeDecodeError are ValueErrors
        raise PolicyError(path, [(1, f"cannot read policy: {exc}")]) from None
    return parse_policy(text, path)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    try:
        data, lines = load_with_lines(text)
    except YamlError as exc:
        raise PolicyError(source, [(exc.line, exc.message)]) from None
    if not isinstance(data, dict):
        raise PolicyError(source, [(1, "a policy must be a YAML mapping (version, pools, rules, ...)")])
    try:
        spec = PolicySpec.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(source, [_located(err, lines) for err in exc.errors()]) from None
    problems = [(_line_of(path, lines), f"{_dotted(path)}: {msg}") for path, msg in _check(spec)]
    rules: list[CompiledRule] = []
    for i, rule in enumerate(spec.rules):
        try:
            matches = None if rule.when is None else compile_condition(rule.when, spec.pools, ("rules", i, "when"))
        except ConditionError as exc:
            problems.append((_line_of(exc.path, lines), f"{_dotted(exc.path)}: {exc.message}"))
            continue
        candidates = tuple(dict.fromkeys(rule.candidates or spec.pools)) if rule.route == FASTEST else ()
        reason = rule.reason or (f"matched {rule.when}" if rule.when else "catch-all")
        rules.append(CompiledRule(rule.name, rule.route, reason, matches, candidates))
    if problems:
        raise PolicyError(source, problems)
    classifier = DomainClassifier((DomainRule(name, d.patterns, d.keywords) for name, d in spec.domains.items()),
                                  default=spec.default_domain)
    return Policy(spec=spec, source=source, rules=tuple(rules), classifier=classifier)


def _check(spec: PolicySpec) -> list[tuple[tuple[Any, ...], str]]:
    """Cross-field rules pydantic cannot express: names that must exist, cycles."""
    pools = spec.pools
    problems: list[tuple[tuple[Any, ...], str]] = []
    if spec.default_pool is not None and spec.default_pool not in pools:
        problems.append((("default_pool",), f"unknown pool '{spec.default_pool}'"))
    for name, pool in pools.items():
        if pool.fallback is None:
            continue
        if pool.fallback not in pools:
            problems.append((("pools", name, "fallback"), f"unknown pool '{pool.fallback}'"))
        elif _fallback_cycle(name, pools):
            problems.append((("pools", name, "fallback"),
                             f"fallback chain from '{name}' loops: {' -> '.join(_fallback_cycle(name, pools))}"))
    if FASTEST in pools:
        problems.append((("pools", FASTEST), f"'{FASTEST}' is a route, not a pool name"))
    seen: dict[str, int] = {}
    for i, rule in enumerate(spec.rules):
        if rule.route not in pools and rule.route != FASTEST:
            problems.append((("rules", i, "route"),
                             f"unknown pool '{rule.route}' (pools: {', '.join(pools)}, or {FASTEST})"))
        if rule.candidates is not None and rule.route != FASTEST:
            problems.append((("rules", i, "candidates"), f"candidates go with route: {FASTEST} only"))
        problems += [(("rules", i, "candidates", j), f"unknown pool '{name}' (pools: {', '.join(pools)})")
                     for j, name in enumerate(rule.candidates or ()) if name not in pools]
        if rule.name in seen:
            problems.append((("rules", i, "name"),
                             f"duplicate rule name '{rule.name}' (also rules[{seen[rule.name]}])"))
        seen.setdefault(rule.name, i)
    return problems


def _walk(pools: dict[str, PoolSpec], pool: str) -> tuple[str, ...]:
    """`pool`, then its fallback, that one's fallback, ...: each pool once, and
    only pools that exist. The one walk of a chain: `Policy.fallback_chain`
    serves it to routing, the proxy and the guard; the loader checks loops with it."""
    chain = [pool]
    while (fallback := pools[chain[-1]].fallback) in pools and fallback not in chain:
        chain.append(fallback)
    return tuple(chain)


def _fallback_cycle(start: str, pools: dict[str, PoolSpec]) -> list[str]:
    """The loop through `start`, e.g. [a, b, a]; [] when its chain does not come back to it."""
    chain = _walk(pools, start)
    return [*chain, start] if pools[chain[-1]].fallback == start else []


def _located(err: Any, lines: dict[tuple[Any, ...], int]) -> tuple[int, str]:
    loc, message = tuple(err["loc"]), err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown key (not part of the policy schema)"
    elif err["type"] == "missing":
        message = "required field is missing"
    return _line_of(loc, lines), f"{_dotted(loc)}: {message}"


def _line_of(path: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> int:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return 1


def _dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top>"
