"""`Policy`: a loaded policy, with what the hot path needs precompiled: the
rules' predicates, the domain classifier, each pool's fallback chain and
drafting schedule. loader.py builds one from a file and checks it first.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from domains.classifier import DomainClassifier
from gateway.policy.conditions import Predicate
from gateway.policy.features import Defaults
from gateway.policy.kinds import KINDS, Schedule, schedule_of
from gateway.policy.pools import PoolSpec, fallback_chain
from gateway.policy.priors import SloSpec
from gateway.policy.schema import PolicySpec


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

    def baseline_pool(self, pool: str) -> str | None:
        """The standard pool `pool`'s latency is compared with: the pool it falls
        back to when that one is standard, else the policy's first standard pool."""
        chain = self.fallback_chains[pool]
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
    def objectives(self) -> dict[str, SloSpec]:
        """Each pool's objective, where it states one (`slo`); admission reads rooms only
        where this is not empty."""
        return {name: pool.slo for name, pool in self.pools.items() if pool.slo.stated}

    @cached_property
    def standard_pools(self) -> tuple[str, ...]:
        """The pools that never draft, in the policy's order."""
        return tuple(name for name, schedule in self.schedules.items() if not schedule.ever_drafts)

    @cached_property
    def fallback_chains(self) -> dict[str, tuple[str, ...]]:
        """Each pool, and the pools tried after it, in order. The request path reads this
        and `rule_priorities` as dicts: a cached property is then the instance's attribute,
        read with no call."""
        return {name: fallback_chain(self.pools, name) for name in self.pools}

    @cached_property
    def rule_priorities(self) -> dict[str, int]:
        """The `priority:` of each rule that sets one, by the rule's name (names are unique)."""
        return {rule.name: rule.priority for rule in self.spec.rules if rule.priority is not None}

    @cached_property
    def defaults(self) -> Defaults:
        d = self.spec.defaults
        return Defaults(temperature=d.temperature, top_p=d.top_p, max_tokens=d.max_tokens)
