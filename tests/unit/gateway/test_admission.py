"""Admission at the gateway: hold only when every candidate is past its objective and holding is what
the request's own objective, or else the fleet's cost, asks for."""

from __future__ import annotations

import asyncio

import pytest

from gateway.decide.admission import hold, past_rooms
from gateway.decide.fastest import fastest
from gateway.decide.latency import LatencyModel
from gateway.policy.features import Features
from gateway.policy.kinds import Schedule
from gateway.policy.loader import load_policy, parse_policy
from gateway.policy.priors import SloSpec
from gateway.settings import default_policy_path
from gateway.upstream.admission import AdmissionGate

POLICY_YAML = """version: 1
pools:
  spec:
    kind: speculative
    endpoints: [{url: "http://127.0.0.1:9"}]
    slo: {tpot_s: 0.02}
  std:
    kind: standard
    endpoints: [{url: "http://127.0.0.1:10"}]
    slo: {tpot_s: 0.02}
  free:
    kind: standard
    endpoints: [{url: "http://127.0.0.1:11"}]
rules: [{name: all, route: fastest, candidates: [spec, std]}]
"""
POLICY = parse_policy(POLICY_YAML)


def features(load: dict[str, int]) -> Features:
    return Features(endpoint="chat", model=None, temperature=0.0, top_p=1.0, max_tokens=256, stream=True, n=1,
                    prompt_chars=100, prompt_tokens=25, tools=False, response_format=False, logprobs=False,
                    domain="chat", load=load)


def decide(load: dict[str, int], pools: tuple[str, ...] = ("spec", "std"), tokens: int = 256,
           objectives: dict | None = None, model: LatencyModel | None = None) -> tuple:
    """The draw of `route: fastest` with the candidates' rooms, as routing takes it."""
    model = model if model is not None else LatencyModel(POLICY.schedules)  # an empty model is falsy
    found = fastest(pools, features(load), "chat/greedy", tokens, model, None)
    return found.within(past_rooms(found, POLICY.objectives if objectives is None else objectives, model)), model


def with_slo(slo: SloSpec) -> dict[str, SloSpec]:
    """Every pool's objective `slo`, as `Policy.objectives` gives them."""
    return dict.fromkeys(POLICY.pools, slo)


def room(model: LatencyModel, pool: str, **kwargs) -> int:
    found = model.room(pool, "chat/greedy", None, kwargs.pop("tpot_s", 0.02), kwargs.pop("tokens", 256), 1000,
                       **kwargs)
    assert found is not None
    return found


def test_light_load_is_never_held() -> None:
    for load in ({"spec": 0, "std": 0}, {"spec": 40, "std": 0}, {"spec": 4, "std": 4}, {"spec": 36, "std": 16}):
        found, _ = decide(load)
        assert hold(found, POLICY.objectives, ahead=0) is None, load


def test_past_every_room_a_request_is_held_for_at_most_its_own_objective() -> None:
    found, _ = decide({"spec": 45, "std": 45})
    held = hold(found, POLICY.objectives, ahead=0)
    assert held is not None and set(held.pools) == {"spec", "std"}
    assert held.objective_s == held.budget_s == 256 * 0.02
    assert 0 < held.expected_wait_s < held.budget_s
    assert "past its room" in held.why
    # those held ahead of it are in its expected wait
    behind = hold(found, POLICY.objectives, ahead=100)
    assert behind is not None and behind.expected_wait_s > held.expected_wait_s


def test_the_room_moves_by_one_request_not_by_a_bucket() -> None:
    # a cold model's buckets stand for their middles, and the curves are read between them:
    # objectives a millisecond apart give rooms apart inside the one bucket of 32-63 sequences,
    # where bucket values alone would give its bottom or nothing
    _, model = decide({"spec": 0, "std": 0})
    rooms = [room(model, "std", tpot_s=tpot) for tpot in (0.022, 0.023, 0.024)]
    assert 31 <= rooms[0] < rooms[1] < rooms[2] < 63
    slower = with_slo(SloSpec(tpot_s=0.022))
    assert decide({"spec": 500, "std": rooms[0]}, objectives=slower)[0].past.keys() == {"spec"}
    found, _ = decide({"spec": 500, "std": rooms[0] + 1}, objectives=slower)
    assert found.past == {"spec": room(model, "spec", tpot_s=0.022), "std": rooms[0]}
    assert hold(found, slower, ahead=0) is not None


def test_the_room_leaves_time_for_the_first_token_and_the_wait_at_the_gateway() -> None:
    _, model = decide({"spec": 0, "std": 0})
    # so long an answer that its first token's wait is nothing: the room by TPOT alone
    tpot_only = room(model, "std", tokens=10**9)
    assert room(model, "std", tokens=20) < tpot_only  # the TTFT comes out of the budget
    assert room(model, "std", waited_s=1.0) < room(model, "std")
    model.admitted("std", 1.0)  # the pool's requests waited at the gateway: its room shrinks
    assert model.gateway_wait("std") == 1.0
    found, _ = decide({"spec": 500, "std": room(model, "std", waited_s=1.0) + 1}, model=model)
    assert "std" in found.past
    for _ in range(200):  # nobody waits any more: the room comes back
        model.admitted("std", 0.0)
    assert room(model, "std", waited_s=model.gateway_wait("std")) == room(model, "std")


def test_the_room_is_for_the_pools_mean_answer() -> None:
    _, model = decide({"spec": 0, "std": 0})
    assert model.answer_tokens("std", 256) == 256  # before any answer: the request's expected tokens
    for _ in range(200):
        model.answered("std", 40)
    assert round(model.answer_tokens("std", 256)) == 40
    # a short answer's budget has less room for its first token
    assert room(model, "std", tokens=40) < room(model, "std")
    assert decide({"spec": 500, "std": room(model, "std", tokens=40) + 1}, model=model)[0].past.keys() == {
        "spec", "std"}


def step_s(batch: int) -> float:
    """A replica whose step time grows by 0.3 ms a sequence: 22 ms at 40 sequences."""
    return 0.010 + 0.0003 * batch


def observed(answers: dict[str, tuple[int, ...]]) -> LatencyModel:
    """A model that heard many answers per class of the standard pool, each at its batch,
    with the step time `step_s` gives there."""
    model = LatencyModel(POLICY.schedules)
    for cls, batches in answers.items():
        for batch in batches * 100:
            model.observe("std", cls, batch - 1, 0.05, step_s(batch), batch=batch)
    return model


def test_a_bucket_stands_for_the_load_its_answers_ran_at() -> None:
    # every answer of the buckets of 16-31, 32-63 and 64-127 sequences ran at their low end: read
    # at their middles (23.5, 47.5, 95.5), the curve would put 22 ms past 50 sequences
    model = observed({"chat/greedy": (16, 17, 18, 32, 33, 34, 64, 65, 66)})
    by_tpot = model.room("std", "chat/greedy", None, step_s(40), 10**9, 1000)
    assert by_tpot is not None and 38 <= by_tpot <= 40  # 40 in the batch with it: 39 before it


def test_the_room_searched_from_the_last_one_is_the_highest_load_that_fits() -> None:
    # a room is searched from the one found before; wherever the objective moves it, up or
    # down, by one or by hundreds, it is the highest load that fits, as a scan of every load says
    model = observed({"chat/greedy": (1, 2, 4, 8, 16, 33, 64, 128)})
    scan = observed({"chat/greedy": (1, 2, 4, 8, 16, 33, 64, 128)})
    rooms = []
    for tpot in (0.02, 0.0201, 0.025, 0.03, 0.021, 0.0205, 0.045, 0.019, 0.0195):
        found = model.room("std", "chat/greedy", None, tpot, 256, 500)
        # room(..., below=load + 1) is `load` exactly where `load` fits: no search runs
        fitting = [load for load in range(500) if scan.room("std", "chat/greedy", None, tpot, 256, load + 1) == load]
        assert found == max(fitting)
        rooms.append(found)
    assert len(set(rooms)) >= 6 and 0 < min(rooms) and max(rooms) < 499  # it moved, inside the range


def test_on_a_dynamic_pool_a_class_whose_drafts_collapsed_has_its_room_past_the_switch() -> None:
    # drafting costs such a class more than a plain step: it fits just past the switch, where the
    # replica decodes plainly, and not below it; the room is still the highest load that fits
    schedules = {"early": Schedule(((1, 8, 4), (9, 9, 0))), "late": Schedule(((1, 16, 4), (17, 17, 0)))}

    def collapsed() -> LatencyModel:
        model = LatencyModel(schedules)
        for pool in schedules:
            for _ in range(50):
                model.acceptance.observe(pool, "code/greedy", 1.05, 4)  # 1.05 tokens a drafting step
        return model

    windows = 0
    for pool in schedules:
        for tpot in (0.013, 0.014, 0.015, 0.016, 0.02, 0.025):
            # room(..., below=load + 1) on a model with no room found before reads `load` first
            fitting = [load for load in range(60) if collapsed().room(pool, "code/greedy", None, tpot, 256, load + 1)
                       == load]
            windows += any(load + 1 not in fitting and load + 1 < 60 for load in fitting[:-1])
            model = collapsed()
            for below in (60, 12, 5, 30, 9, 60, 20, 3):
                assert model.room(pool, "code/greedy", None, tpot, 256, below) == max(
                    [load for load in fitting if load < below], default=None), (pool, tpot, below, fitting)
    assert windows > 0  # some objective fits past a switch and not below it


def test_the_room_is_the_pools_not_one_classs() -> None:
    # one class answered only fast, at high load; another a third slower: one more sequence slows
    # both alike, so both read the pool's one room (read from each class's tables, the fast
    # class would fill the replica past where the other meets its objective)
    model = observed({"code/greedy": (16, 33, 34, 64)})
    for batch in (8, 9, 33) * 100:
        model.observe("std", "chat/greedy", batch - 1, 0.05, 1.3 * step_s(batch), batch=batch)
    assert model.predict("std", "chat/greedy", 33, 1).tpot_s > model.predict("std", "code/greedy", 33, 1).tpot_s
    rooms = {cls: model.room("std", cls, None, 0.02, 256, 1000) for cls in ("code/greedy", "chat/greedy")}
    assert rooms["code/greedy"] == rooms["chat/greedy"] is not None


def test_placement_keeps_to_a_candidate_within_its_room() -> None:
    # the draw prefers the speculative pool; past its room, the request goes where there is room
    found, _ = decide({"spec": 0, "std": 0})
    assert found.pool == "spec"
    found, model = decide({"spec": 60, "std": 5})
    assert set(found.past) == {"spec"} and found.pool == "std"
    assert hold(found, POLICY.objectives, ahead=0) is None
    assert found.best == min(found.estimates, key=lambda e: e.cost_s).pool  # what the model prefers, kept


def test_a_pool_without_an_objective_always_has_room() -> None:
    found, _ = decide({"spec": 40, "free": 500}, ("spec", "free"))
    assert "free" not in found.past
    assert hold(found, POLICY.objectives, ahead=0) is None


def test_the_shipped_policy_holds_a_burst_and_nothing_else() -> None:
    # both pools state 50 ms a token: a request at light load goes in, and one that finds every
    # replica at a burst's load (past its room on the priors' curve) waits, at most its objective
    shipped = load_policy(default_policy_path())
    assert {pool: (slo.ttft_s, slo.tpot_s) for pool, slo in shipped.objectives.items()} == {
        "speculative": (None, 0.05), "standard": (None, 0.05)}
    model = LatencyModel(shipped.schedules)
    pools = ("speculative", "standard")
    for load in ({"speculative": 0, "standard": 0}, {"speculative": 8, "standard": 3}):
        found = fastest(pools, features(load), "chat/greedy", 256, model, None)
        assert hold(found.within(past_rooms(found, shipped.objectives, model)), shipped.objectives, 0) is None
    burst = {"speculative": 400, "standard": 400}
    found = fastest(pools, features(burst), "chat/greedy", 256, model, None)
    held = hold(found.within(past_rooms(found, shipped.objectives, model)), shipped.objectives, 0)
    assert held is not None and held.budget_s == pytest.approx(256 * 0.05)


def test_no_room_is_read_where_no_pool_states_an_objective() -> None:
    # every pool's `slo` defaults to an empty one: such a pool reads no room per request
    assert POLICY.objectives.keys() == {"spec", "std"}
    empty = parse_policy(POLICY_YAML.replace("slo: {tpot_s: 0.02}", "slo: {}"))
    assert not empty.objectives and not empty.pools["spec"].slo.stated
    found, _ = decide({"spec": 10**6, "std": 10**6}, objectives=empty.objectives)
    assert found.past == {} and hold(found, empty.objectives, ahead=0) is None


def test_an_objective_no_load_meets_is_never_waited_for() -> None:
    strict = with_slo(SloSpec(tpot_s=0.001))
    for load in (1, 33, 600):
        found, _ = decide({"spec": load, "std": load}, objectives=strict)
        assert found.past == {}, load
        assert hold(found, strict, ahead=0) is None, load


def test_a_replica_too_slow_for_the_objective_is_not_left_idle_while_requests_wait() -> None:
    # `std` cannot meet its objective even alone (a CPU replica against a GPU pace): it has
    # room, so a request that finds `spec` past its room goes there instead of waiting for `spec`
    mixed = {"spec": SloSpec(tpot_s=0.02), "std": SloSpec(tpot_s=0.001)}
    found, _ = decide({"spec": 45, "std": 45}, objectives=mixed)
    assert found.past.keys() == {"spec"} and found.pool == "std"
    assert hold(found, mixed, ahead=0) is None
    # with both able to meet it, the same loads are held (the test above this one's twin)
    found, _ = decide({"spec": 45, "std": 45})
    assert hold(found, POLICY.objectives, ahead=0) is not None


def test_a_first_token_objective_alone_bounds_the_ttft() -> None:
    ttft_only = with_slo(SloSpec(ttft_s=0.2))
    _, model = decide({"spec": 0, "std": 0})
    highest = model.room("std", "chat/greedy", 0.2, None, 256, 1000)
    assert highest is not None and model.room("std", "chat/greedy", 0.3, None, 256, 1000) > highest
    found, _ = decide({"spec": 2000, "std": highest + 1}, objectives=ttft_only)
    assert hold(found, ttft_only, ahead=0) is not None


def test_the_gate_releases_by_priority_then_deadline_then_arrival_and_spends_budgets() -> None:
    async def scenario() -> list[str]:
        gate = AdmissionGate()
        order: list[str] = []

        async def held(name: str, priority: int, due: float, pools: tuple[str, ...]) -> None:
            woke = await gate.wait(pools, gate.rank(priority, due), 30.0)
            order.append(name if woke else f"{name}:budget")

        tasks = [asyncio.create_task(held("low", 0, 5.0, ("a",))),
                 asyncio.create_task(held("high", 5, 9.0, ("a", "b"))),
                 asyncio.create_task(held("low-later", 0, 5.0, ("a",))),
                 asyncio.create_task(held("low-due-first", 0, 1.0, ("a",))),
                 asyncio.create_task(held("b-only", 9, 0.0, ("b",)))]
        while gate.held < 5:
            await asyncio.sleep(0)
        assert gate.ahead(5) == 2 and gate.ahead(0) == 5
        for _ in range(4):
            gate.released("a")
            await asyncio.sleep(0)
        gate.released("b")
        await asyncio.gather(*tasks)
        budget = await gate.wait(("a",), gate.rank(0, 0.0), 0.0)
        return [*order, str(budget)]

    assert asyncio.run(scenario()) == ["high", "low-due-first", "low", "low-later", "b-only", "False"]


def test_a_cancelled_waiter_leaves_the_gate() -> None:
    async def scenario() -> int:
        gate = AdmissionGate()
        task = asyncio.create_task(gate.wait(("a",), gate.rank(0, 0.0), 30.0))
        while gate.held < 1:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.released("a")  # nobody to wake
        return gate.held

    assert asyncio.run(scenario()) == 0
