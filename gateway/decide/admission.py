"""Admission at the gateway: whether a request waits here instead of entering an engine.

A pool may state its objective for the requests it runs (`slo: {ttft_s,
tpot_s}`): each one's first token within `ttft_s` and each token after within
`tpot_s`, so a request of n expected tokens meets it when its E2E is within
`ttft_s + n x tpot_s`, its own objective (with no `tpot_s`, the model's TPOT
at the load where it would go in stands for it). When one more request would
push every candidate past the pool's objective (the predicted TPOT at
load + 1 over `tpot_s`, or TTFT over `ttft_s`), sending it anyway slows every
sequence already running there past theirs; held at the gateway, it keeps
their batch where they meet it, and goes in at `room`, the highest load below
where one more meets it, after a wait of one lease coming back per
`E2E(L) / L` for every request above `room` and every one held ahead of it.

What is held is what the goodput asks for, each request by its own objective:

1. a candidate with room, or with no objective, takes it: light load never holds;
2. held, if it still meets its own objective after that wait (it makes it
   either way, and the ones running keep theirs), for as long as it still would;
3. sent now, if only going now keeps it within its objective (a short answer
   in a burst: its budget is too small to wait);
4. a request that misses its objective either way is held while waiting costs
   the fleet less, in the currency placement uses (fastest.py): sent now to a
   candidate at load L it costs E2E(L) + added(L), held it costs
   wait + E2E(room) + added(room), and the difference is its budget.

A pool so slow that no load meets the objective has no `room`: waiting cannot
bring it back, so nothing waits for it. The gate wakes held requests by
priority, then by their objective's deadline (the earliest first: a short
answer before a long one that can still afford to wait); a woken request
still over the objectives waits again in its place. A held request whose
budget runs out is admitted then, never refused for having waited: the
queue's own deadline and its 429/503 are for pools at their in-flight limits
(queue.py).

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
    objective_s: float  # the request's own objective for its E2E: the gate wakes the earliest due first
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"pools": list(self.pools), "budget_s": round(self.budget_s, 6),
                "expected_wait_s": round(self.expected_wait_s, 6), "objective_s": round(self.objective_s, 6),
                "why": self.why}


@dataclass(frozen=True, slots=True)
class _Room:
    """Where a held request would go in on one candidate, and what it would cost there."""
    wait_s: float  # until the load is down to where one more meets the objective
    e2e_s: float  # its own E2E there, after the wait
    saved_s: float  # what going in there saves the fleet over going in now
    objective_s: float  # its own objective on that candidate


def over(estimate: Estimate, slo: SloSpec) -> bool:
    """Whether one more request on the estimate's pool is past the pool's objective."""
    predicted = estimate.predicted
    return ((slo.tpot_s is not None and predicted.tpot_s > slo.tpot_s)
            or (slo.ttft_s is not None and predicted.ttft_s > slo.ttft_s))


def objective(slo: SloSpec, tokens: int, tpot_s: float) -> float:
    """A request's own objective for its E2E on a pool: the first token within `ttft_s`
    and each of its `tokens` within `tpot_s` (or `tpot_s`, the model's, where unstated)."""
    return (slo.ttft_s or 0.0) + tokens * (slo.tpot_s if slo.tpot_s is not None else tpot_s)


def hold(found: Fastest, pools: Mapping[str, PoolSpec], model: LatencyModel, ahead: int) -> Hold | None:
    """A `Hold` when every candidate is past its objective and holding is what the request's
    own objective, or else the fleet's cost, asks for; None: admit now. `ahead`: requests
    already held that go before this one."""
    rooms, meets_now = [], False
    for estimate in found.estimates:
        spec = pools.get(estimate.pool)
        slo = None if spec is None else spec.slo
        if slo is None or estimate.load == 0 or not over(estimate, slo):
            return None  # a candidate with room, or with no objective: nothing to keep
        room = _room(estimate, slo, model, found.traffic, found.tokens, ahead)
        if room is None:
            continue  # no load meets the objective there: waiting cannot bring it back
        rooms.append(room)
        meets_now = meets_now or estimate.predicted.e2e_s <= room.objective_s
    pools_held = tuple(e.pool for e in found.estimates)
    later = [r for r in rooms if r.wait_s + r.e2e_s <= r.objective_s]
    if later:  # it meets its objective after waiting: hold while it still would
        best = max(later, key=lambda r: r.objective_s - r.e2e_s - r.wait_s)
        return Hold(pools_held, best.objective_s - best.e2e_s, best.wait_s, best.objective_s,
                    f"every candidate is past its objective at one more; after the expected wait "
                    f"({best.wait_s:.3f} s) it still meets its own ({best.objective_s:.3f} s)")
    if meets_now:
        return None  # only going now keeps it within its objective
    paying = [r for r in rooms if r.wait_s < r.saved_s]
    if not paying:
        return None
    best = max(paying, key=lambda r: r.saved_s - r.wait_s)
    return Hold(pools_held, best.saved_s, best.wait_s, best.objective_s,
                f"every candidate is past its objective at one more and it misses its own either way; "
                f"waiting costs the fleet less (expected {best.wait_s:.3f} s of {best.saved_s:.3f} s)")


def _room(estimate: Estimate, slo: SloSpec, model: LatencyModel, traffic: str, tokens: int,
          ahead: int) -> _Room | None:
    """The highest load below the estimate's where one more request meets the objective, and
    what going in there would mean: where a held request would go in. The model's curves step
    at its load buckets (batches of 2^j to 2^(j+1) - 1), so the walk goes to the top of each
    bucket below."""
    batch = estimate.load + 1
    while batch > 1:
        batch = (1 << (batch.bit_length() - 1)) - 1
        load = batch - 1
        predicted, slope = model.estimate(estimate.pool, traffic, load, tokens)
        if (slo.tpot_s is None or predicted.tpot_s <= slo.tpot_s) and (
                slo.ttft_s is None or predicted.ttft_s <= slo.ttft_s):
            # one lease back per E2E / load, until the load is down to `load` with those ahead gone in
            wait = (estimate.load - load + ahead) * estimate.predicted.e2e_s / estimate.load
            saved = estimate.cost_s - (predicted.e2e_s + load * tokens / 2 * slope)
            return _Room(wait, predicted.e2e_s, saved, objective(slo, tokens, predicted.tpot_s))
    return None
