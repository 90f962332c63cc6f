"""`decide(features, policy, flags, draw) -> Decision`: a pure function, and
`route(body, endpoint, policy, load, flags)`: extract the features, then decide.

The first rule whose condition holds names a pool (or the `x-specgate-route`
header does, when the policy allows it). If that pool's speculation flag is
off, the request goes down the pool's fallback chain instead, except for the
probe share (`draw < probe_fraction`, auto mode only) that keeps the guard fed.
A traffic class the guard took off the pool (auto mode) is treated the same
way, for that class only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.decide.features import Features, extract_features
from gateway.decide.policy import Policy
from gateway.decide.traffic import traffic_class
from gateway.errors import InvalidRequest
from gateway.flags import FlagSnapshot


@dataclass(frozen=True, slots=True)
class Decision:
    pool: str
    rule: str
    reason: str
    probe: bool = False

    def to_json(self, features: Features, flags: FlagSnapshot) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "rule": self.rule,
            "reason": self.reason,
            "probe": self.probe,
            "features": features.to_json(),
            "flags": {name: flag.to_json() for name, flag in flags.items()},
        }


@dataclass(frozen=True, slots=True)
class Overrides:
    """What the client's routing headers say, when the policy lets them."""
    domain: str | None = None  # x-specgate-domain
    route: str | None = None  # x-specgate-route

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], policy: Policy) -> Overrides:
        allowed = policy.spec.overrides
        return cls(domain=headers.get("x-specgate-domain") if allowed.domain_header else None,
                   route=headers.get("x-specgate-route") if allowed.route_header else None)


@dataclass(frozen=True, slots=True)
class Routed:
    features: Features
    decision: Decision

    def to_json(self, flags: FlagSnapshot) -> dict[str, Any]:
        return self.decision.to_json(self.features, flags)


def route(body: Mapping[str, Any], endpoint: str, policy: Policy, load: Mapping[str, int],
          flags: FlagSnapshot, overrides: Overrides = Overrides(), draw: float = 1.0) -> Routed:
    """The decision for a parsed body, without sending anything anywhere: its
    features, then `decide`. An `x-specgate-route` naming no pool is a 400."""
    if overrides.route is not None and overrides.route not in policy.pools:
        raise InvalidRequest(f"x-specgate-route names unknown pool '{overrides.route}'", param="x-specgate-route")
    features = extract_features(body, endpoint, policy.defaults, policy.classifier, load,
                                domain_override=overrides.domain, route_override=overrides.route)
    return Routed(features, decide(features, policy, flags, draw))


def decide(features: Features, policy: Policy, flags: FlagSnapshot, draw: float = 1.0) -> Decision:
    chosen = _choose(features, policy)
    flag = flags.get(chosen.pool)
    if flag is None:
        return chosen
    why, probing = flag.reason, flag.probing
    if flag.routable:
        traffic = traffic_class(features.domain, features.temperature) if flag.disabled_classes else ""
        if not traffic or not flag.class_off(traffic):
            return chosen
        why, probing = f"class {traffic} is slower with speculation", True
    if probing and draw < policy.spec.guard.speculative.probe_fraction:
        return Decision(chosen.pool, chosen.rule,
                        f"probe: speculation is off ({why}) but a share still goes",
                        probe=True)
    target = _fallback(chosen.pool, policy, flags)
    return Decision(target, chosen.rule,
                    f"{chosen.reason}; speculation off on '{chosen.pool}' ({why}), "
                    f"sent to '{target}'")


def _choose(features: Features, policy: Policy) -> Decision:
    if features.route is not None and features.route in policy.pools:
        return Decision(features.route, "header", "x-specgate-route header")
    for rule in policy.rules:
        if rule.matches is None or rule.matches(features):
            return Decision(rule.route, rule.name, rule.reason)
    return Decision(policy.default_pool, "default_pool", "no rule matched")


def _fallback(pool: str, policy: Policy, flags: FlagSnapshot) -> str:
    chain = policy.fallback_chain(pool)
    for candidate in chain[1:]:
        flag = flags.get(candidate)
        if flag is None or flag.routable:
            return candidate
    standard = [n for n, p in policy.pools.items() if p.kind == "standard" and n not in chain]
    return standard[0] if standard else pool
