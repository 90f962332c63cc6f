"""Pool kinds, drafting schedules, acceptance learned per class, and what they do to predictions."""

from __future__ import annotations

import pytest

from gateway.decide.acceptance import Acceptance, rate_of, tokens_per_step
from gateway.decide.latency import LatencyModel
from gateway.policy.kinds import KINDS, UNBOUNDED, PoolKind, Schedule, schedule_of
from gateway.policy.loader import PolicyError, parse_policy
from gateway.upstream.drafting import Drafting


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy_text(kind: str, schedule: str = "") -> str:
    return f"""version: 1
pools:
  fast:
    kind: {kind}
    endpoints: [{{url: "http://127.0.0.1:9"}}]
{schedule}
rules: [{{name: all, route: fast}}]
"""


def test_every_kind_is_a_row_with_a_schedule() -> None:
    assert set(KINDS) == set(PoolKind)
    assert schedule_of(PoolKind.SPECULATIVE, 4).drafts(1) == schedule_of(PoolKind.SPECULATIVE, 4).drafts(10_000) == 4
    assert not schedule_of(PoolKind.STANDARD, 4).ever_drafts
    dynamic = schedule_of(PoolKind.DYNAMIC, 4, [[1, 8, 4], [9, 32, 2], [33, 33, 0]])
    assert [dynamic.drafts(b) for b in (1, 8, 9, 32, 33, 500)] == [4, 4, 2, 2, 0, 0]


def test_a_dynamic_pool_states_its_schedule_and_only_it_may() -> None:
    policy = parse_policy(policy_text("dynamic", "    speculation_schedule: [[1, 16, 3], [17, 17, 0]]"))
    assert policy.schedules["fast"] == Schedule(((1, 16, 3), (17, 17, 0)))
    assert policy.speculative_pools == ("fast",) and policy.standard_pools == ()
    with pytest.raises(PolicyError, match="states its speculation_schedule"):
        parse_policy(policy_text("dynamic"))
    with pytest.raises(PolicyError, match="goes with kind: dynamic"):
        parse_policy(policy_text("standard", "    speculation_schedule: [[1, 16, 3]]"))
    with pytest.raises(PolicyError, match="overlaps"):
        parse_policy(policy_text("dynamic", "    speculation_schedule: [[1, 16, 3], [8, 32, 2]]"))
    with pytest.raises(PolicyError, match=r"\[lo, hi, k\]"):
        parse_policy(policy_text("dynamic", "    speculation_schedule: [[1, 16]]"))
    with pytest.raises(PolicyError, match="starts at batch size 1"):
        parse_policy(policy_text("dynamic", "    speculation_schedule: [[2, 16, 3], [17, 17, 0]]"))


def test_a_schedule_that_never_switches_is_refused_with_the_fix() -> None:
    # the last range holds for every larger batch: [[1, 16, 3]] drafts 3 at 500 sequences too
    with pytest.raises(PolicyError, match=r"drafts 3 at every batch size.*\[17, 17, 0\].*kind: speculative"):
        parse_policy(policy_text("dynamic", "    speculation_schedule: [[1, 16, 3]]"))
    with pytest.raises(PolicyError, match="kind: standard"):
        parse_policy(policy_text("dynamic", "    speculation_schedule: [[1, 8, 0], [9, 16, 0]]"))


def test_a_schedule_drafts_no_deeper_and_counts_no_higher_than_a_policy_may_say() -> None:
    # `specgate up` starts vLLM drafting as deep as the schedule's deepest step: a depth past what
    # the priors allow is refused in the file, with the bound, not in an engine's start-up log
    with pytest.raises(PolicyError, match=r"k <= 32"):
        parse_policy(policy_text("dynamic", "    speculation_schedule: [[1, 16, 100000], [17, 17, 0]]"))
    with pytest.raises(PolicyError, match=r"hi <= 1073741824"):
        parse_policy(policy_text("dynamic", "    speculation_schedule: [[1, 16, 3], [17, 10000000000000, 0]]"))
    deepest = parse_policy(policy_text("dynamic", "    speculation_schedule: [[1, 16, 32], [17, 17, 0]]"))
    assert deepest.schedules["fast"].drafts(1) == 32
    with pytest.raises(PolicyError, match="draft_tokens"):
        parse_policy(policy_text("speculative") + "routing: {priors: {draft_tokens: 33}}\n")


@pytest.mark.parametrize("ranges", [[[1, 8, 3], [9, 32, 2], [33, 1024, 0]], [[1, 16, 3], [32, 128, 2]],
                                    [[1, 4, 0], [5, 9, 2]], [[1, 2, 4], [3, 4, 2], [5, 1024, 0]]])
def test_the_gateway_reads_a_schedule_as_the_engines_do(ranges) -> None:
    # backends.speculation is checked against vLLM's own lookup (tests/unit/vllm); the gateway's
    # latency model must see the same drafts at every batch size, gaps and beyond the last range included
    from backends.speculation import SpeculationSchedule

    engine = SpeculationSchedule.parse(ranges)
    gateway = schedule_of(PoolKind.DYNAMIC, 8, ranges)
    assert [gateway.drafts(b) for b in range(1, 2000)] == [engine.tokens_at(b, 8) for b in range(1, 2000)]
    # the room's stretches start at exactly the loads past which one more sequence drafts unlike the load below
    assert gateway.stretches == tuple(load for load in range(1, 2000)
                                      if gateway.drafts(load + 1) != gateway.drafts(load))


def test_policy_priors_are_settable_and_checked() -> None:
    text = policy_text("speculative") + "routing: {priors: {acceptance: {chat: {hot: 0.9}}, draft_tokens: 5}}\n"
    policy = parse_policy(text)
    assert policy.schedules["fast"] == Schedule(((1, UNBOUNDED, 5),))
    assert policy.spec.routing.priors.acceptance_of("chat", "hot") == 0.9
    with pytest.raises(PolicyError, match="unknown band"):
        parse_policy(policy_text("speculative") + "routing: {priors: {acceptance: {chat: {tepid: 0.5}}}}\n")


@pytest.mark.parametrize("a, k", [(0.0, 3), (0.3, 3), (0.72, 3), (0.95, 5), (0.5, 1)])
def test_rate_of_inverts_tokens_per_step(a: float, k: int) -> None:
    assert rate_of(tokens_per_step(a, k), k) == pytest.approx(a, abs=1e-6)


def test_unusable_lengths_teach_nothing() -> None:
    assert rate_of(0.5, 3) is None and rate_of(float("nan"), 3) is None and rate_of(2.0, 0) is None
    assert rate_of(4.0, 3) == pytest.approx(0.999)


VLLM_BODY = (b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
             b'"content":"say \\"mean_acceptance_length\\": 9"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,'
             b'"total_tokens":29,"completion_tokens":20},"metrics":{"speculative_decoding":{"mean_acceptance_length":'
             b'2.5,"draft_acceptance_rate":0.5,"acceptance_histogram":[2,2,2,2],"num_spec_steps":8,'
             b'"num_accepted_draft_tokens":12,"num_draft_tokens":24,"num_spec_tokens":3}}}')


def test_the_backends_own_metrics_are_read_from_a_body_and_a_last_chunk() -> None:
    assert Drafting.reported(VLLM_BODY) == Drafting(2.5, 3)
    chunk = (b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":5},'
             b'"metrics":{"speculative_decoding":{"mean_acceptance_length":1.25e0,"num_spec_steps":4,'
             b'"num_spec_tokens":2}}}\n\ndata: [DONE]\n\n')
    assert Drafting.reported(chunk) == Drafting(1.25, 2)
    no_steps = b'{"metrics":{"speculative_decoding":{"mean_acceptance_length":1.0,"num_spec_steps":0}}}'
    assert Drafting.reported(no_steps) is None
    assert Drafting.reported(b'{"choices":[{"message":{"content":"mean_acceptance_length"}}]}') is None


def test_events_stand_in_for_the_metrics() -> None:
    assert Drafting.of_events(tokens=30, events=13, usage_event=True) == Drafting(3.0)
    assert Drafting.of_events(tokens=1, events=5, usage_event=False) is None
    assert Drafting.of_events(tokens=5, events=2, usage_event=False) is None


def test_acceptance_starts_at_the_prior_and_follows_a_degrading_draft() -> None:
    clock = Clock()
    acceptance = Acceptance(clock=clock)
    assert acceptance.rate("spec", "code/greedy") == 0.85 and acceptance.rate("spec", "chat/hot") == 0.15
    assert acceptance.rate("spec", "poetry/greedy") == 0.72  # an unknown domain reads chat's
    for _ in range(50):
        clock.now += 0.2
        acceptance.observe("spec", "code/greedy", tokens_per_step(0.3, 3), 3)
    assert acceptance.rate("spec", "code/greedy") == pytest.approx(0.3, abs=0.05)
    assert acceptance.rate("other", "code/greedy") == 0.85  # per pool


def test_silence_forgets_nothing_and_a_new_answer_outweighs_old_ones() -> None:
    """A class the prior sends elsewhere is explored rarely: what its few answers
    taught must still count when the next decision comes, minutes later."""
    clock = Clock()
    acceptance = Acceptance(clock=clock)
    for _ in range(3):
        clock.now += 1.0
        acceptance.observe("spec", "chat/hot", tokens_per_step(0.55, 3), 3)
    learned = acceptance.rate("spec", "chat/hot")
    assert 0.4 < learned < 0.55  # nearly three answers (0.55) against the prior's one (0.15)
    clock.now += 600
    assert acceptance.rate("spec", "chat/hot") == learned
    acceptance.observe("spec", "chat/hot", tokens_per_step(0.2, 3), 3)  # ten minutes on, the draft degraded
    assert acceptance.rate("spec", "chat/hot") == pytest.approx((0.2 + 0.15) / 2, abs=0.01)


def test_a_domain_whose_drafts_collapsed_reads_collapsed_in_every_band() -> None:
    """The draft model stopped predicting code: answers of one band teach the others
    (each band of a domain sees few answers), and a band whose drafts beat its prior
    says nothing of the others' (the playbook's bands are steeper than many drafts)."""
    clock = Clock()
    acceptance = Acceptance(clock=clock)
    for cls in ("code/low", "code/mid", "code/hot"):
        clock.now += 1.0
        acceptance.observe("spec", cls, tokens_per_step(acceptance.prior(cls) * 0.1, 3), 3)
    factor = acceptance.domain_factor("spec", "code")
    assert factor == pytest.approx(0.1, abs=0.01)  # three answers that agree on a tenth set the prior aside
    assert acceptance.rate("spec", "code/greedy") == pytest.approx(0.85 * factor)  # never answered itself
    assert acceptance.rate("spec", "math/greedy") == 0.8  # another domain
    assert acceptance.rate("other", "code/greedy") == 0.85  # another pool
    for _ in range(3):
        clock.now += 1.0
        acceptance.observe("spec", "chat/hot", tokens_per_step(0.6, 3), 3)  # four times the prior of 0.15
    assert acceptance.domain_factor("spec", "chat") == 1.0
    assert acceptance.rate("spec", "chat/greedy") == 0.72
    assert acceptance.rate("spec", "chat/hot") > 0.45  # its own answers still teach it
    listed = {row["class"]: row for row in acceptance.snapshot()}
    assert listed["code/low"]["domain_factor"] == pytest.approx(factor, abs=1e-4)


def test_answers_set_the_prior_aside_only_beyond_their_spread_and_a_recovered_draft_gets_it_back() -> None:
    clock = Clock()
    acceptance = Acceptance(clock=clock)

    def answer(cls: str, ratio: float) -> None:
        clock.now += 1.0
        acceptance.observe("spec", cls, tokens_per_step(acceptance.prior(cls) * ratio, 3), 3)

    answer("code/greedy", 0.1)
    assert acceptance.domain_factor("spec", "code") == pytest.approx(0.55, abs=0.01)  # one answer: shrunk
    for ratio in (0.9, 0.5, 1.0, 0.6):  # a draft a little below its prior, answers spread widely
        answer("math/greedy", ratio)
    spread = acceptance.domain_factor("spec", "math")
    weight = acceptance.snapshot()[-1]["samples"]
    assert spread == pytest.approx((weight * 0.748 + 1.0) / (weight + 1.0), abs=0.02)  # shrunk, not set aside
    for ratio in (0.12, 0.08):
        answer("code/mid", ratio)
    collapsed = acceptance.domain_factor("spec", "code")
    assert collapsed < 0.12  # three answers that agree, far below 1: the prior is set aside
    for _ in range(4):
        answer("code/low", 1.0)  # the draft recovered
    assert acceptance.domain_factor("spec", "code") > 0.7  # the prior back, as the mean climbs


def test_a_change_of_draft_forgets_what_the_domains_classes_learned_before_it() -> None:
    clock = Clock()
    acceptance = Acceptance(clock=clock)
    for _ in range(8):  # greedy code, often answered while the draft was good
        clock.now += 0.5
        acceptance.observe("spec", "code/greedy", tokens_per_step(0.85, 3), 3)
    acceptance.observe("spec", "math/greedy", tokens_per_step(0.8, 3), 3)
    for cls in ("code/mid", "code/hot", "code/mid"):  # the draft stops predicting code
        clock.now += 1.0
        acceptance.observe("spec", cls, tokens_per_step(acceptance.prior(cls) * 0.1, 3), 3)
    assert acceptance.rate("spec", "code/greedy") == pytest.approx(0.085, abs=0.01)  # not its eight old answers
    listed = {row["class"]: row for row in acceptance.snapshot()}
    assert listed["code/greedy"]["samples"] == 0 and listed["math/greedy"]["samples"] == 1


SCHEDULES = {"spec": schedule_of(PoolKind.SPECULATIVE, 3), "std": schedule_of(PoolKind.STANDARD, 3),
             "dyn": schedule_of(PoolKind.DYNAMIC, 3, [[1, 7, 3], [8, 8, 0]])}


def test_a_cold_model_prefers_speculation_for_greedy_code_and_standard_for_hot_sampling() -> None:
    model = LatencyModel(SCHEDULES, clock=Clock())
    for cls, faster in [("code/greedy", "spec"), ("chat/greedy", "spec"), ("chat/mid", "spec"),
                        ("chat/hot", "std"), ("code/hot", "std")]:
        spec, std = model.predict("spec", cls, 0, 256).e2e_s, model.predict("std", cls, 0, 256).e2e_s
        assert (spec < std) == (faster == "spec"), cls


def test_a_dynamic_pool_follows_the_drafting_curve_below_its_switch_and_the_plain_one_above() -> None:
    model = LatencyModel(SCHEDULES, clock=Clock())
    def tpot(pool: str, load: int) -> float:
        return model.predict(pool, "chat/greedy", load, 1).tpot_s

    assert all(tpot("dyn", load) == tpot("spec", load) for load in (0, 2, 5))
    assert all(tpot("dyn", load) == tpot("std", load) for load in (7, 40, 300))


def test_measured_acceptance_moves_a_class_off_speculation_and_keeps_the_pools_step_time() -> None:
    clock = Clock()
    model = LatencyModel(SCHEDULES, clock=clock)
    step = model.predict("spec", "code/greedy", 0, 1).tpot_s * tokens_per_step(0.85, 3)
    for _ in range(40):  # the draft degrades for code: one token a step, at the same step time
        clock.now += 0.25
        model.observe("spec", "code/greedy", 0, 0.06, step / 1.0, per_step=1.0, drafts=3)
    code = model.predict("spec", "code/greedy", 0, 256)
    assert code.e2e_s > model.predict("std", "code/greedy", 0, 256).e2e_s
    # the pool's step time is what was measured, so a class still accepted as before stays fast
    chat = model.predict("spec", "chat/greedy", 0, 256)
    assert chat.tpot_s == pytest.approx(step / tokens_per_step(0.72, 3), rel=0.1)


def test_the_slope_of_the_curve_is_the_delay_a_request_adds() -> None:
    model = LatencyModel(SCHEDULES, clock=Clock())
    assert model.estimate("std", "chat/greedy", 0, 1)[1] == pytest.approx(0.0003, rel=0.01)
    assert model.estimate("spec", "chat/greedy", 16, 1)[1] > model.estimate("std", "chat/greedy", 16, 1)[1]
