"""The planner's replay: the simulator's step model, batch by batch, without a clock."""

from __future__ import annotations

import dataclasses

import pytest

from backends.sim.model import DEFAULT_PARAMS, step_seconds
from backends.speculation import SpeculationSchedule
from specgate.plan.fleet import replay
from specgate.plan.workload import PlannedRequest


def together(count: int, max_tokens: int = 40) -> list[PlannedRequest]:
    return [PlannedRequest(0.0, "code", 0.0, max_tokens, prompt_tokens=100) for _ in range(count)]


def test_one_request_on_a_standard_replica_takes_a_prefill_and_one_step_a_token():
    (job,) = replay([("standard", DEFAULT_PARAMS)], together(1))
    expected = step_seconds("standard", 0, 100) + 39 * step_seconds("standard", 1)
    assert job.ttft == pytest.approx(step_seconds("standard", 0, 100))
    assert job.e2e == pytest.approx(expected)


@pytest.mark.parametrize("ranges,like", [([[1, 1024, 0]], "standard"), ([[1, 2, 3], [3, 1024, 0]], "speculative")])
def test_a_dynamic_replica_replays_as_the_kind_its_schedule_makes_it(ranges, like):
    """Two requests never make a batch over 2: a switch above 2 speculates on every step, k = 0 never."""
    dynamic = dataclasses.replace(DEFAULT_PARAMS, speculation_schedule=SpeculationSchedule.parse(ranges))
    ours = replay([("dynamic", dynamic)], together(2), seed=5)
    theirs = replay([(like, DEFAULT_PARAMS)], together(2), seed=5)
    assert [job.e2e for job in ours] == [job.e2e for job in theirs]


def test_requests_spread_over_a_fleet_of_one_kind():
    jobs = replay([("standard", DEFAULT_PARAMS)] * 2, together(2))
    alone = replay([("standard", DEFAULT_PARAMS)], together(1))[0]
    assert [job.e2e for job in jobs] == pytest.approx([alone.e2e] * 2)  # one each, none shares a batch
