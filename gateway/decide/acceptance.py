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

The domain's factor is shrunk toward 1 (the prior holds) by one answer's
weight, until its latest answers say otherwise beyond their own spread: once
the mean of its last `RECENT` answers lies below 1 by more than `SET_ASIDE`
standard errors (their spread, at least `MIN_SPREAD`), the prior is set aside
and the factor is that recent mean. A draft degrades at a moment: the answers
before it, however many, say nothing of it, so the test reads the latest
answers only. Shrinking alone left a collapsed draft read at a third of its
prior thirty seconds on, high enough to keep sending it the domain's long
answers. When the prior is set aside, what the domain's classes learned on
that pool before is forgotten too: those answers came before the change. A
draft that recovers fails the test at its first good answer, and the prior
is back; its classes learn again from their answers.

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
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from gateway.policy.classes import split_class
from gateway.policy.priors import PriorsSpec

RECENT = 3  # a domain's latest answers, read for a change of its draft
SET_ASIDE = 3.0  # standard errors below 1 at which those answers set the domain's prior aside
MIN_SPREAD = 0.05  # the least spread assumed of them, so answers that agree are not certainty


def tokens_per_step(a: float, drafts: int) -> float:
    """Tokens one verification step yields: the accepted prefix plus the target's own token."""
    if drafts <= 0:
        return 1.0
    if a >= 1.0:
        return float(drafts + 1)
    return (1.0 - a ** (drafts + 1)) / (1.0 - a)


def rate_of(length: float, drafts: int) -> float | None:
    """The per-token rate `a` whose expected tokens per step is `length`, or None if unusable.

    Newton's method from the top of the range: tokens per step is increasing and convex in
    `a`, so each step lands between the root and the last one, and a handful reach it (a
    bisection to the same precision took 40 calls; this runs on every answer that reports
    acceptance)."""
    if drafts <= 0 or not 1.0 <= length < math.inf:
        return None
    n = drafts + 1
    a = 0.999
    for _ in range(64):
        power = a ** drafts  # a^(n-1)
        gap = (1.0 - power * a) / (1.0 - a) - length
        if gap <= 0.0:  # at (or past, by rounding) the root; at the top, a length of n or more
            return a
        slope = ((1.0 - power * a) - n * power * (1.0 - a)) / ((1.0 - a) * (1.0 - a))
        step = gap / slope
        a -= step
        if step < 1e-9:
            break
    return max(a, 0.0)  # a length of 1: no draft accepted, to rounding


class Acceptance:
    """Per (pool, class): the forgotten weight and mean of observed rates, anchored on the prior."""

    def __init__(self, priors: PriorsSpec | None = None, half_life_s: float = 10.0, max_pairs: int = 512,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.priors = priors or PriorsSpec()
        self.max_pairs = max_pairs
        self._decay_rate = -math.log(2) / half_life_s
        self._clock = clock
        self._pairs: OrderedDict[tuple[str, str], list[float]] = OrderedDict()  # [weight, mean, at]
        self._drafts: OrderedDict[tuple[str, str], _Draft] = OrderedDict()  # per (pool, domain)
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
        _follow(_entry(self._pairs, (pool, cls), lambda: [0.0, 0.0, now], self.max_pairs), rate, now,
                self._decay_rate)
        domain = split_class(cls)[0]
        draft = _entry(self._drafts, (pool, domain), lambda: _Draft(now), self.max_pairs)
        if draft.add(min(rate / prior, 1.0) if prior > 0 else 1.0, now, self._decay_rate, self.priors.weight):
            for (held, held_cls), pair in self._pairs.items():
                if held == pool and split_class(held_cls)[0] == domain:
                    pair[0] = 0.0  # answered before the change: the set-aside factor holds the news

    def rate(self, pool: str, cls: str) -> float:
        """The estimate: the class's answers against its prior times what the domain's answers
        say of the draft (`domain_factor`), each by its weight as the last answer left it."""
        anchor, w0 = self._prior.get(cls) or self.prior(cls), self.priors.weight
        draft = self._drafts.get((pool, cls.rpartition("/")[0] or cls))  # split_class's domain, inline
        if draft is not None:
            anchor *= draft.factor
        pair = self._pairs.get((pool, cls))
        if pair is None:
            return anchor
        weight = pair[0]
        return (weight * pair[1] + w0 * anchor) / (weight + w0)

    def domain_factor(self, pool: str, domain: str) -> float:
        """The draft's measured rate over the prior's on `domain` (at most 1), shrunk toward 1
        until its answers set the prior aside."""
        found = self._drafts.get((pool, domain))
        return 1.0 if found is None else found.factor

    def snapshot(self) -> list[dict[str, Any]]:
        return [{"pool": pool, "class": cls, "rate": round(self.rate(pool, cls), 4), "prior": self.prior(cls),
                 "domain_factor": round(self.domain_factor(pool, split_class(cls)[0]), 4),
                 "samples": round(pair[0], 3), "last_answer_s_ago": round(self._clock() - pair[2], 3)}
                for (pool, cls), pair in self._pairs.items()]


class _Draft:
    """What one pool's answers of one domain say of its draft: the mean of their
    rate over the prior's, forgotten as `_follow` forgets, its latest values, and
    the factor they give (`Acceptance.domain_factor`), set at each answer."""
    __slots__ = ("mean", "recent", "factor", "aside")

    def __init__(self, now: float) -> None:
        self.mean = [0.0, 0.0, now]  # [weight, mean, at]
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.factor = 1.0
        self.aside = False  # the latest answers set the prior aside

    def add(self, ratio: float, now: float, decay_rate: float, prior_weight: float) -> bool:
        """One more answer's ratio; True when it sets the prior aside (it was not before)."""
        _follow(self.mean, ratio, now, decay_rate)
        self.recent.append(ratio)
        was_aside, recent = self.aside, self._set_aside()
        self.aside = recent is not None
        weight, mean, _ = self.mean
        self.factor = recent if recent is not None else (weight * mean + prior_weight) / (weight + prior_weight)
        return self.aside and not was_aside

    def _set_aside(self) -> float | None:
        """The latest answers' mean, where they lie below 1 beyond their spread; else None."""
        if len(self.recent) < RECENT:
            return None
        # By hand: it runs on every answer that reports acceptance, and `statistics.stdev`
        # (exact fractions) costs ~25 µs where this costs ~1.
        mean = sum(self.recent) / RECENT
        if 1.0 - mean <= SET_ASIDE * MIN_SPREAD / math.sqrt(RECENT):  # the usual case: no spread sets it aside
            return None
        spread = math.sqrt(sum((r - mean) ** 2 for r in self.recent) / (RECENT - 1))
        return mean if 1.0 - mean > SET_ASIDE * max(spread, MIN_SPREAD) / math.sqrt(RECENT) else None


def _entry(means: OrderedDict[tuple[str, str], Any], key: tuple[str, str], new: Callable[[], Any],
           bound: int) -> Any:
    """`key`'s entry of `means`, made by `new` if absent; the least recently answered go past `bound`."""
    found = means.get(key)
    if found is None:
        found = means[key] = new()
        if len(means) > bound:
            means.popitem(last=False)
    else:
        means.move_to_end(key)
    return found


def _follow(pair: list[float], value: float, now: float, decay_rate: float) -> None:
    """One more value of a [weight, mean, at] mean: the ones before it weigh by their age."""
    weight = pair[0] * math.exp(decay_rate * (now - pair[2])) + 1.0
    pair[1] += (value - pair[1]) / weight
    pair[0], pair[2] = weight, now
