"""How often each pool's drafts are accepted, per traffic class, learned online.

A speculative answer says how many tokens its steps yielded: vLLM's
`metrics.speculative_decoding.mean_acceptance_length` (with
`--per-request-spec-decode-metrics summary`), or, when a backend does not say,
the output tokens over the stream's events (a speculative engine sends one
event per step). Inverting `(1 - a^(k+1)) / (1 - a)` gives the per-token rate
`a`, which does not depend on `k`, so a dynamic pool's answers at any batch
size teach the same estimate. Per (pool, class) the estimate is an
exponentially forgetting mean shrunk toward the policy's prior for the class
(`routing.priors.acceptance`), so a draft that degrades is followed in a few
half-lives and an unseen class starts from the playbook's matrix.

Two levels, as the latency model has: a draft degrades by domain (its draft
model has stopped predicting code), whatever the temperature, while each band
of the domain sees few answers. So per (pool, domain) there is also the
draft's measured rate over the prior's, from every band's answers, capped at
1 (the playbook's bands are steeper than many drafts: a hot band accepting
three times its prior says nothing of the greedy one); a class's estimate is
shrunk toward its prior times that factor rather than toward the prior alone.
A domain whose drafts collapsed is then read as collapsed in every band from
the first few answers of any of them, where a band sent there now and then
sat halfway between its one answer and a prior that no longer holds.

It forgets on evidence, not on silence: a new answer outweighs the ones
before it by their age, but while a class sends nothing to the pool its
estimate stays where its last answers left it. A draft's acceptance is the
draft model's, and it does not drift back to the prior because nobody asked.
Forgetting by the clock alone made a class that the prior sends elsewhere (hot
sampling, predicted to collapse) unlearnable: its rare explored answers were
forgotten before the next one came, so the prior always won, however well the
draft did.

Called from the event loop only. Memory is bounded by `max_pairs`.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from gateway.policy.classes import split_class
from gateway.policy.priors import PriorsSpec


def tokens_per_step(a: float, drafts: int) -> float:
    """Tokens one verification step yields: the accepted prefix plus the target's own token."""
    if drafts <= 0:
        return 1.0
    if a >= 1.0:
        return float(drafts + 1)
    return (1.0 - a ** (drafts + 1)) / (1.0 - a)


def rate_of(length: float, drafts: int) -> float | None:
    """The per-token rate `a` whose expected tokens per step is `length` (bisection), or None if unusable."""
    if drafts <= 0 or not 1.0 <= length < math.inf:
        return None
    if length >= drafts + 1:
        return 0.999
    low, high = 0.0, 0.999
    for _ in range(40):
        mid = (low + high) / 2
        if tokens_per_step(mid, drafts) < length:
            low = mid
        else:
            high = mid
    return (low + high) / 2


class Acceptance:
    """Per (pool, class): the forgotten weight and mean of observed rates, anchored on the prior."""

    def __init__(self, priors: PriorsSpec | None = None, half_life_s: float = 10.0, max_pairs: int = 512,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.priors = priors or PriorsSpec()
        self.max_pairs = max_pairs
        self._decay_rate = -math.log(2) / half_life_s
        self._clock = clock
        self._pairs: OrderedDict[tuple[str, str], list[float]] = OrderedDict()  # [weight, mean, at]
        self._domains: OrderedDict[tuple[str, str], list[float]] = OrderedDict()  # the same, of rate / prior
        self._prior: dict[str, float] = {}  # the priors' rate per class, looked up once

    def prior(self, cls: str) -> float:
        prior = self._prior.get(cls)
        if prior is None:
            prior = self.priors.acceptance_of(*split_class(cls))
            if len(self._prior) < self.max_pairs:  # classes are few; a flood of odd names is not kept
                self._prior[cls] = prior
        return prior

    def observe(self, pool: str, cls: str, length: float, drafts: int) -> None:
        """One answer's mean tokens per step at `drafts` drafted tokens; an unusable one is left out."""
        rate = rate_of(length, drafts)
        if rate is None:
            return
        now = self._clock()
        prior = self.prior(cls)
        self._follow(self._pairs, (pool, cls), rate, now)
        self._follow(self._domains, (pool, split_class(cls)[0]), min(rate / prior, 1.0) if prior > 0 else 1.0, now)

    def _follow(self, means: OrderedDict[tuple[str, str], list[float]], key: tuple[str, str], value: float,
                now: float) -> None:
        """One more value of `key`'s mean: the ones before it weigh by their age."""
        pair = means.get(key)
        if pair is None:
            pair = means[key] = [0.0, 0.0, now]
            if len(means) > self.max_pairs:
                means.popitem(last=False)
        else:
            means.move_to_end(key)
        weight = pair[0] * math.exp(self._decay_rate * (now - pair[2])) + 1.0
        pair[1] += (value - pair[1]) / weight
        pair[0], pair[2] = weight, now

    def rate(self, pool: str, cls: str) -> float:
        """The estimate: the class's answers against its prior times what the domain's answers
        say of the draft (`domain_factor`), each by its weight as the last answer left it."""
        anchor, w0 = self._prior.get(cls) or self.prior(cls), self.priors.weight
        domain = self._domains.get((pool, cls.rpartition("/")[0] or cls))  # split_class's domain, inline
        if domain is not None:
            anchor *= (domain[0] * domain[1] + w0) / (domain[0] + w0)
        pair = self._pairs.get((pool, cls))
        if pair is None:
            return anchor
        weight = pair[0]
        return (weight * pair[1] + w0 * anchor) / (weight + w0)

    def domain_factor(self, pool: str, domain: str) -> float:
        """The draft's measured rate over the prior's on `domain` (at most 1), shrunk toward 1."""
        found = self._domains.get((pool, domain))
        w0 = self.priors.weight
        return 1.0 if found is None else (found[0] * found[1] + w0) / (found[0] + w0)

    def snapshot(self) -> list[dict[str, Any]]:
        return [{"pool": pool, "class": cls, "rate": round(self.rate(pool, cls), 4), "prior": self.prior(cls),
                 "domain_factor": round(self.domain_factor(pool, split_class(cls)[0]), 4),
                 "samples": round(pair[0], 3), "last_answer_s_ago": round(self._clock() - pair[2], 3)}
                for (pool, cls), pair in self._pairs.items()]
