"""`decide(features, policy, flags, draw, model, rng) -> Decision`: a pure
function (the latency model is only read, the random generator passed in), and
`route(body, endpoint, policy, load, flags, ...)`: extract the features, then decide.

The first rule whose condition holds names a pool (or the `x-specgate-route`
header does, when the policy allows it). If that pool's speculation flag is
off, the request goes down the pool's fallback chain instead, except for the
probe share (`draw < probe_fraction`, auto mode only) that keeps the guard fed.
A traffic class the guard took off the pool (auto mode) is treated the same
way, for that class only.

A rule with `route: fastest` chooses among its candidates by predicted E2E
(gateway.decide.fastest). A candidate whose flag is off, or off for the
request's class, is not a candidate (but the probe share still goes to it);
with none left the request takes the first candidate's fallback. The guard's
verdicts (not `force_off`) leave a candidate out only while another candidate
that is on would decode the request plainly at its load: on a fleet where
every other candidate drafts too, leaving it out moves the request onto a pool
that drafts as much, and takes the pool's capacity from the fleet.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.decide.admission import past_rooms
from gateway.decide.fastest import Fastest, fastest, model_class
from gateway.decide.features import extract_features
from gateway.decide.latency import LatencyModel, LatencyPriors
from gateway.errors import InvalidRequest
from gateway.flags import FlagSnapshot
from gateway.policy.classes import traffic_class
from gateway.policy.compiled import CompiledRule, Policy
from gateway.policy.features import Features
from gateway.policy.schema import FASTEST


class Decision:
    """Where one request goes, and why. A plain class, built per request: mypyc compiles the
    `__init__` written out, where a named tuple's `__new__` runs interpreted. Read-only by convention."""

    def __init__(self, pool: str, rule: str, note: str, probe: bool = False, chain: tuple[str, ...] = (),
                 fastest: Fastest | None = None, home: str | None = None, fallback: str | None = None) -> None:
        self.pool = pool
        self.rule = rule
        self.note = note  # why, in words; under `route: fastest`, only what it left out (`reason` says the rest)
        self.probe = probe
        self.chain = chain  # the pools to try in order, when not the pool's fallback chain
        self.fastest = fastest  # how `route: fastest` chose
        self.home = home  # the one endpoint (URL) that may serve it: it holds the state the request continues
        self.fallback = fallback  # why it left the pool its rule chose before anything was sent (`flag`)

    @property
    def explored(self) -> bool:
        return self.fastest is not None and self.fastest.explored

    @property
    def reason(self) -> str:
        """Why it went where it did. Written when asked (explain, traces), not per request."""
        found = self.fastest
        if found is None:
            return self.note
        return (f"fastest of {len(found.estimates)}: predicted E2E {found.chosen.predicted.e2e_s:.3f} s"
                + (f"; explored (by the mean: '{found.best}')" if found.explored else "")
                + (f"; {self.note}" if self.note else ""))

    def to_json(self, features: Features, flags: FlagSnapshot) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "rule": self.rule,
            "reason": self.reason,
            "probe": self.probe,
            "explored": self.explored,
            "chain": list(self.chain),
            "fastest": None if self.fastest is None else self.fastest.to_json(),
            "home": self.home,
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
        domain = headers.get("x-specgate-domain") if allowed.domain_header else None
        route = headers.get("x-specgate-route") if allowed.route_header else None
        return NO_OVERRIDES if domain is None and route is None else cls(domain=domain, route=route)


NO_OVERRIDES = Overrides()  # what nearly every request says: nothing (a frozen dataclass costs ~1 us to build)


class Routed:
    """A request's features and the decision made on them (a plain class, as `Decision` is)."""

    def __init__(self, features: Features, decision: Decision) -> None:
        self.features = features
        self.decision = decision

    def to_json(self, flags: FlagSnapshot) -> dict[str, Any]:
        return self.decision.to_json(self.features, flags)


def route(body: Mapping[str, Any], endpoint: str, policy: Policy, load: Mapping[str, int],
          flags: FlagSnapshot, overrides: Overrides = NO_OVERRIDES, draw: float = 1.0,
          model: LatencyModel | None = None, rng: random.Random | None = None) -> Routed:
    """The decision for a parsed body, without sending anything anywhere: its
    features, then `decide`. An `x-specgate-route` naming no pool is a 400."""
    if overrides.route is not None and overrides.route not in policy.pools:
        raise InvalidRequest(f"x-specgate-route names unknown pool '{overrides.route}'", param="x-specgate-route")
    features = extract_features(body, endpoint, policy.defaults, policy.classifier, load,
                                domain_override=overrides.domain, route_override=overrides.route)
    return Routed(features, decide(features, policy, flags, draw, model, rng))


def decide(features: Features, policy: Policy, flags: FlagSnapshot, draw: float = 1.0,
           model: LatencyModel | None = None, rng: random.Random | None = None) -> Decision:
    """`model` (read only; a cold one when None) and `rng` (None: no exploration) serve `route: fastest`."""
    if features.route is not None and features.route in policy.pools:
        return _guarded(Decision(features.route, "header", "x-specgate-route header"), features, policy, flags,
                        draw)
    for rule in policy.rules:
        if rule.matches is None or rule.matches(features):
            if rule.route == FASTEST:
                return _fastest(rule, features, policy, flags, draw,
                                model if model is not None else cold_model(policy), rng)
            return _guarded(Decision(rule.route, rule.name, rule.reason), features, policy, flags, draw)
    return _guarded(Decision(policy.default_pool, "default_pool", "no rule matched"), features, policy, flags, draw)


def cold_model(policy: Policy) -> LatencyModel:
    """A model that has measured nothing: its predictions are the policy's priors."""
    routing = policy.spec.routing
    return LatencyModel(policy.schedules, LatencyPriors(routing.priors), half_life_s=routing.half_life_s)


def _fastest(rule: CompiledRule, features: Features, policy: Policy, flags: FlagSnapshot, draw: float,
             model: LatencyModel, rng: random.Random | None) -> Decision:
    usable, offs = [], {}
    for pool in rule.candidates:
        off = _off(pool, features, flags)
        if off is None:
            usable.append(pool)
        else:
            offs[pool] = off
    left_out = []
    if offs and not _any_plain(usable, features, policy):
        # the guard's verdict moves a request onto a pool that drafts less: with none to go to,
        # leaving its pool out would only take that pool's capacity from the fleet
        left_out = [f"'{pool}' is off ({why}) but kept: no candidate on decodes plainly"
                    for pool, (why, probing) in offs.items() if probing]
        usable = [pool for pool in rule.candidates if pool in usable or offs[pool][1]]
        offs = {pool: off for pool, off in offs.items() if not off[1]}
    for pool, (why, probing) in offs.items():
        left_out.append(f"'{pool}' is off ({why})")
        if probing and draw < policy.spec.guard.speculative.probe_fraction:
            return _probe(pool, rule.name, why)
    if not usable:
        return _guarded(Decision(rule.candidates[0], rule.name, "; ".join(left_out)), features, policy, flags, draw)
    spec = policy.spec
    tokens = min(features.max_tokens, spec.routing.typical_output_tokens)
    traffic = model_class(features, spec.domains, spec.default_domain)
    found = fastest(usable, features, traffic, tokens, model, rng)
    if policy.objectives:
        found = found.within(past_rooms(found, policy.objectives, model))
    return Decision(found.pool, rule.name, "; ".join(left_out), chain=found.chain(policy.fallback_chains[found.pool]),
                    fastest=found)


def _any_plain(pools: list[str], features: Features, policy: Policy) -> bool:
    """Whether one of `pools` would decode the request without drafting, at its load plus the request."""
    schedules, loads = policy.schedules, features.load
    return any(schedules[p].drafts(loads.get(p, 0) + 1) == 0 for p in pools)


def _off(pool: str, features: Features, flags: FlagSnapshot) -> tuple[str, bool] | None:
    """Why `pool` may not take the request and whether a probe share still goes; None when it may."""
    flag = flags.get(pool)
    if flag is None:
        return None
    if flag.routable:
        traffic = traffic_class(features.domain, features.temperature) if flag.disabled_classes else ""
        if not traffic or not flag.class_off(traffic):
            return None
        return f"class {traffic} is slower with speculation", True
    return flag.reason, flag.probing


def _guarded(chosen: Decision, features: Features, policy: Policy, flags: FlagSnapshot, draw: float) -> Decision:
    """`chosen`, unless its pool's flag is off: then a probe share, or its fallback."""
    off = _off(chosen.pool, features, flags)
    if off is None:
        return chosen
    why, probing = off
    if probing and draw < policy.spec.guard.speculative.probe_fraction:
        return _probe(chosen.pool, chosen.rule, why)
    target = _fallback(chosen.pool, policy, flags)
    return Decision(target, chosen.rule,
                    f"{chosen.reason}; speculation off on '{chosen.pool}' ({why}), "
                    f"sent to '{target}'", fallback="flag" if target != chosen.pool else None)


def _probe(pool: str, rule: str, why: str) -> Decision:
    return Decision(pool, rule, f"probe: speculation is off ({why}) but a share still goes", probe=True)


def _fallback(pool: str, policy: Policy, flags: FlagSnapshot) -> str:
    chain = policy.fallback_chains[pool]
    for candidate in chain[1:]:
        flag = flags.get(candidate)
        if flag is None or flag.routable:
            return candidate
    standard = [n for n, p in policy.pools.items() if n in policy.standard_pools and n not in chain]
    return standard[0] if standard else pool
