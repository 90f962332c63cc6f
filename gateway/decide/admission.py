"""Admission at the gateway: whether a request waits here instead of entering an engine.

A pool may state its objective for the requests it runs (`slo: {ttft_s,
tpot_s}`). When one more request would push every candidate past its
objective (the predicted TPOT at load + 1 over `tpot_s`, or TTFT over
`ttft_s`), sending it anyway slows every sequence already running there past
theirs; holding it at the gateway keeps their batch where they meet it. So it
waits, in priority order, and is routed again the moment a lease comes back.

Holding must pay, and the model says when it does. The request's own objective
is `ttft_s + tokens x tpot_s` (without `ttft_s` the first token counts within
the per-token objective, as "E2E per output token" does). Once it goes in, at
the highest load where one more request meets the objective, it takes its
predicted E2E there; its budget for waiting is the objective minus that. The
wait it can expect is one lease coming back per `E2E / load` for every request
held ahead of it, plus one. A request whose expected wait exceeds its budget would miss its objective
waiting too, so it goes in at once: light load never holds (an idle candidate,
or one under its objective, takes it), and neither does a trace where holding
would not pay. A held request whose budget runs out is admitted then, never
refused for having waited: the queue's own deadline and its 429/503 are for
pools at their in-flight limits (queue.py).

Pure functions of the decision: the cost is nothing unless every candidate is
over its objective, and then one more prediction per candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.decide.fastest import Estimate, Fastest
from gateway.decide.latency import LatencyModel, Prediction
from gateway.policy.pools import PoolSpec
from gateway.policy.priors import SloSpec


@dataclass(frozen=True, slots=True)
class Hold:
    pools: tuple[str, ...]  # the candidates: a lease coming back on any of them re-routes it
    budget_s: float  # how long waiting still pays
    expected_wait_s: float
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"pools": list(self.pools), "budget_s": round(self.budget_s, 6),
                "expected_wait_s": round(self.expected_wait_s, 6), "why": self.why}


def over(estimate: Estimate, slo: SloSpec) -> bool:
    """Whether one more request on the estimate's pool is past the pool's objective."""
    predicted = estimate.predicted
    return ((slo.tpot_s is not None and predicted.tpot_s > slo.tpot_s)
            or (slo.ttft_s is not None and predicted.ttft_s > slo.ttft_s))


def hold(found: Fastest, pools: Mapping[str, PoolSpec], model: LatencyModel, ahead: int) -> Hold | None:
    """A `Hold` when every candidate is past its objective and waiting pays; None: admit now.
    `ahead`: requests already held that go before this one."""
    budget = wait = 0.0
    for estimate in found.estimates:
        spec = pools.get(estimate.pool)
        slo = None if spec is None else spec.slo
        if slo is None or estimate.load == 0 or not over(estimate, slo):
            return None  # a candidate with room, or with no objective: nothing to keep
        found_room = _admissible(estimate, slo, model, found.traffic, found.tokens)
        if found_room is None:
            continue
        room, admitted = found_room
        objective = (slo.ttft_s or 0.0) + found.tokens * (slo.tpot_s or admitted.tpot_s)
        if objective - admitted.e2e_s > budget:
            budget = objective - admitted.e2e_s
            # one lease back per E2E / load, until the load is down to `room` with those ahead gone in
            wait = (estimate.load - room + ahead) * estimate.predicted.e2e_s / estimate.load
    if budget <= 0 or wait > budget:
        return None
    return Hold(tuple(e.pool for e in found.estimates), budget, wait,
                f"every candidate is past its objective at one more request; waiting pays "
                f"(expected {wait:.3f} s of {budget:.3f} s)")


def _admissible(estimate: Estimate, slo: SloSpec, model: LatencyModel, traffic: str,
                tokens: int) -> tuple[int, Prediction] | None:
    """The highest load below the estimate's where one more request meets the objective, and the
    prediction there: where the held request would go in. The model's curves step at its load
    buckets (batches of 2^j to 2^(j+1) - 1), so the walk goes to the top of each bucket below."""
    batch = estimate.load + 1
    while batch > 1:
        batch = (1 << (batch.bit_length() - 1)) - 1
        predicted = model.predict(estimate.pool, traffic, batch - 1, tokens)
        if (slo.tpot_s is None or predicted.tpot_s <= slo.tpot_s) and (
                slo.ttft_s is None or predicted.ttft_s <= slo.ttft_s):
            return batch - 1, predicted
    return None
