"""Admission at the gateway: whether a request waits here instead of entering an engine.

A pool may state its objective for the requests it runs (`slo: {ttft_s,
tpot_s}`): a request of n output tokens meets it when its E2E is within
`ttft_s + n x tpot_s` (no `ttft_s`: the first token's wait comes out of the
decoding budget, which is the routing benchmark's goodput measure; no
`tpot_s`: its first token within `ttft_s`).

A pool's `room` is the highest load at which one more request still lets a
request of the pool's mean answer length meet that objective, read from the
latency model between its buckets (`LatencyModel.room`): the TTFT at that
load plus the answer's tokens at the TPOT of one more sequence. The first
token's wait is in it on purpose: at the load where TPOT alone reaches
`tpot_s`, every request let in misses by its TTFT.

Rooms bind twice:

1. placement (routing.py): while some candidate is within its room, the
   request goes to the one of those it would have drawn, never past a room
   another candidate still has;
2. admission (`hold`): when every candidate is past its room, one more
   request sent in would slow every sequence already running past the
   objective. It waits at the gateway instead, and the gate lets it in the
   moment a candidate is back within its room. The gate wakes held requests
   by priority, then by the deadline of their own objective (arrival +
   objective: a short answer before a long one that can still afford to
   wait), then arrival. So a burst keeps each replica's batch where its
   requests meet the objective, and the short answers, whose budget cannot
   absorb a slow batch, go first.

A candidate that is idle or states no objective has room, and so has one
where no load meets the objective (a replica too slow for it even alone):
waiting cannot bring that one back, and holding for another replica would
leave it idle while requests wait. A request waits at most its own
objective: by then it has missed, and it goes in as it is (holding never
refuses; the 429 and 503 of a pool at its in-flight limit are the queue's).

Pure functions of the decision: nothing unless a pool states an objective,
then one read of the model's curve per loaded candidate (a search, from the
last room found, only where it is past its room).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any, NamedTuple

from gateway.decide.fastest import Fastest
from gateway.decide.latency import LatencyModel
from gateway.policy.priors import SloSpec


class Hold(NamedTuple):  # a tuple: a burst builds one per request, as the decision's records are
    pools: tuple[str, ...]  # the candidates: a lease coming back on any of them re-routes it
    budget_s: float  # how long it may wait: its own objective
    expected_wait_s: float
    objective_s: float  # the request's own objective for its E2E: the gate wakes the earliest due first
    pool: str  # the candidate expected back within its room first
    room: int  # its room

    @property
    def why(self) -> str:
        """In words, written when read (explain), not per held request."""
        return (f"every candidate is past its room (on {self.pool}: {self.room} in flight, where one more still "
                f"lets a request of its mean answer meet the objective); expected wait {self.expected_wait_s:.3f} s")

    def to_json(self) -> dict[str, Any]:
        return {"pools": list(self.pools), "budget_s": round(self.budget_s, 6),
                "expected_wait_s": round(self.expected_wait_s, 6), "objective_s": round(self.objective_s, 6),
                "why": self.why}


def objective(slo: SloSpec, tokens: float, tpot_s: float) -> float:
    """A request's own objective for its E2E on a pool: the first token within `ttft_s`
    and each of its `tokens` within `tpot_s` (or `tpot_s`, the model's, where unstated)."""
    return (slo.ttft_s or 0.0) + tokens * (slo.tpot_s if slo.tpot_s is not None else tpot_s)


def past_rooms(found: Fastest, objectives: Mapping[str, SloSpec], model: LatencyModel) -> dict[str, int]:
    """The candidates past their room, each with its room. `objectives`: each pool's that
    states one (`Policy.objectives`). One where no load meets its objective is not past."""
    past: dict[str, int] = {}
    for estimate in found.estimates:
        slo = objectives.get(estimate.pool)
        if slo is None or estimate.load == 0:
            continue  # an idle candidate, or one with no objective, has room
        answer = model.answer_tokens(estimate.pool, found.tokens)
        room = model.room(estimate.pool, found.traffic, slo.ttft_s, slo.tpot_s, answer, estimate.load + 1,
                          model.gateway_wait(estimate.pool))
        if room is not None and room < estimate.load:
            past[estimate.pool] = room
    return past


def hold(found: Fastest, objectives: Mapping[str, SloSpec], ahead: int) -> Hold | None:
    """A `Hold` when every candidate is past its room (`found.past`) and one of them can
    come back within it; None: admit now. `ahead`: requests already held that go before
    this one."""
    if len(found.past) < len(found.estimates):
        return None
    waits = []
    for estimate in found.estimates:
        room, slo = found.past[estimate.pool], objectives.get(estimate.pool)
        if slo is None:  # a policy reloaded since the draw lacks the pool
            continue
        # one lease back per E2E / load, until the load is down to the room with those ahead gone in
        wait = (estimate.load - room + ahead) * estimate.predicted.e2e_s / estimate.load
        waits.append((wait, estimate.pool, room, slo, estimate.predicted.tpot_s))
    if not waits:
        return None
    wait, pool, room, slo, tpot_s = min(waits, key=_by_wait)
    own = objective(slo, found.tokens, tpot_s)
    return Hold(tuple([e.pool for e in found.estimates]), own, wait, own, pool, room)


_by_wait = itemgetter(0, 1)  # the shortest wait, then the pool by name
