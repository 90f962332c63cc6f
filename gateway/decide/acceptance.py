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
        key = (pool, cls)
        pair = self._pairs.get(key)
        if pair is None:
            pair = self._pairs[key] = [0.0, 0.0, now]
            if len(self._pairs) > self.max_pairs:
                self._pairs.popitem(last=False)
        else:
            self._pairs.move_to_end(key)
        weight = pair[0] * math.exp(self._decay_rate * (now - pair[2])) + 1.0
        pair[1] += (rate - pair[1]) / weight
        pair[0], pair[2] = weight, now

    def rate(self, pool: str, cls: str) -> float:
        """The estimate: the answers' weight as the last one left it, against the prior's."""
        prior = self.prior(cls)
        pair = self._pairs.get((pool, cls))
        if pair is None:
            return prior
        weight = pair[0]
        w0 = self.priors.weight
        return (weight * pair[1] + w0 * prior) / (weight + w0)

    def snapshot(self) -> list[dict[str, Any]]:
        return [{"pool": pool, "class": cls, "rate": round(self.rate(pool, cls), 4), "prior": self.prior(cls),
                 "samples": round(pair[0], 3), "last_answer_s_ago": round(self._clock() - pair[2], 3)}
                for (pool, cls), pair in self._pairs.items()]
