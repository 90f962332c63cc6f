"""Admission at the gateway: whether a request waits here instead of entering an engine.

A pool may state its objective for the requests it runs (`slo: {ttft_s,
tpot_s}`). When one more request would push every candidate past its
objective (the predicted TPOT at load + 1 over `tpot_s`, or TTFT over
`ttft_s`), sending it anyway slows every sequence already running there past
theirs; holding it at the gateway keeps their batch where they meet it. So it
waits, in priority order, and is routed again the moment a lease comes back.

Holding must pay, and the model says when it does, in the currency placement
already uses: the cost to the fleet (fastest.py), the request's own E2E plus
the delay it adds to every sequence running where it goes. Sent now, to a
candidate at load L, it costs E2E(L) + added(L). Held, it goes in at the
highest load below L where one more request meets the objective (`room`),
after a wait of one lease coming back per `E2E(L) / L` for every request
above `room` and every request held ahead of it, and then costs
wait + E2E(room) + added(room). It is held when that is less: its budget is
the difference without the wait, and the candidate kept is the one where the
margin is widest. Above the knee of a pool's curve the delay added to a full
batch dwarfs a short wait, so a burst is held; close to the objective, or
with a long queue ahead, the wait eats the gain and the request goes in.
Light load never holds (an idle candidate, or one under its objective, takes
it), and neither does a pool so slow that no load meets the objective (no
`room`: waiting cannot bring it back). A held request whose budget runs out is
admitted then, never refused for having waited: the queue's own deadline and
its 429/503 are for pools at their in-flight limits (queue.py).

Pure functions of the decision: the cost is nothing unless every candidate is
over its objective, and then one more prediction per candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.decide.fastest import Estimate, Fastest
from gateway.decide.latency import LatencyModel
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
    """A `Hold` when every candidate is past its objective and waiting costs the fleet less
    than going in now; None: admit now. `ahead`: requests already held that go before this one."""
    best: tuple[float, float] | None = None  # (budget, expected wait) of the widest margin
    for estimate in found.estimates:
        spec = pools.get(estimate.pool)
        slo = None if spec is None else spec.slo
        if slo is None or estimate.load == 0 or not over(estimate, slo):
            return None  # a candidate with room, or with no objective: nothing to keep
        room = _admissible(estimate, slo, model, found.traffic, found.tokens)
        if room is None:
            continue  # no load meets the objective there: waiting cannot bring it back
        load, later = room
        budget = estimate.cost_s - later
        # one lease back per E2E / load, until the load is down to `load` with those ahead gone in
        wait = (estimate.load - load + ahead) * estimate.predicted.e2e_s / estimate.load
        if wait < budget and (best is None or budget - wait > best[0] - best[1]):
            best = budget, wait
    if best is None:
        return None
    budget, wait = best
    return Hold(tuple(e.pool for e in found.estimates), budget, wait,
                f"every candidate is past its objective at one more request; waiting costs the fleet less "
                f"(expected {wait:.3f} s of {budget:.3f} s)")


def _admissible(estimate: Estimate, slo: SloSpec, model: LatencyModel, traffic: str,
                tokens: int) -> tuple[int, float] | None:
    """The highest load below the estimate's where one more request meets the objective, and
    the request's cost to the fleet there: where a held request would go in. The model's curves
    step at its load buckets (batches of 2^j to 2^(j+1) - 1), so the walk goes to the top of
    each bucket below."""
    batch = estimate.load + 1
    while batch > 1:
        batch = (1 << (batch.bit_length() - 1)) - 1
        load = batch - 1
        predicted, slope = model.estimate(estimate.pool, traffic, load, tokens)
        if (slo.tpot_s is None or predicted.tpot_s <= slo.tpot_s) and (
                slo.ttft_s is None or predicted.ttft_s <= slo.ttft_s):
            return load, predicted.e2e_s + load * tokens / 2 * slope
    return None
