"""`route: fastest`, the pure choice: a latency model (read only) and a seeded
generator in, a decision out. Tables of cases over measured and cold models."""

from __future__ import annotations

import random
import statistics
from collections import Counter

import pytest

from gateway.decide.fastest import normal
from gateway.decide.features import extract_features
from gateway.decide.latency import LatencyModel
from gateway.decide.routing import Decision, decide
from gateway.flags import FlagStore, Mode
from gateway.policy.loader import PolicyError, parse_policy

POLICY_TEXT = """
version: 1
pools:
  speculative: {kind: speculative, endpoints: [{url: "http://127.0.0.1:1"}], fallback: standard}
  standard: {kind: standard, endpoints: [{url: "http://127.0.0.1:2"}]}
  other: {kind: standard, endpoints: [{url: "http://127.0.0.1:3"}]}
domains:
  code: {patterns: ["```"]}
overrides: {route_header: true}
rules:
  - {name: pinned, when: {model: pinned}, route: other}
  - {name: pair, when: {model: pair}, route: fastest, candidates: [speculative, standard]}
  - {name: default, route: fastest}
"""
POLICY = parse_policy(POLICY_TEXT)
CHAT = "chat/greedy"  # the class of `body()`
FAST, SLOW = (0.02, 0.002), (0.10, 0.02)  # (ttft_s, tpot_s)


def body(model: str = "pair", **fields):
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "temperature": 0,
            "max_tokens": 100, **fields}


def features(load=None, route=None, **fields):
    return extract_features(body(**fields), "chat", POLICY.defaults, POLICY.classifier, load or {},
                            route_override=route)


def measured(**pools: tuple[float, float]) -> LatencyModel:
    """A model that has seen 50 answers of each pool at load 0 with these times."""
    model = LatencyModel(POLICY.schedules, clock=lambda: 0.0)
    for pool, (ttft, tpot) in pools.items():
        for i in range(50):
            jitter = 1 + (i % 5 - 2) * 0.01
            model.observe(pool, CHAT, 0, ttft * jitter, tpot * jitter)
    return model


def choices(model, n=400, flags=None, draw=0.5, seed=7, **fields) -> tuple[Counter[str], list[Decision]]:
    rng = random.Random(seed)
    flags = flags or FlagStore(POLICY.speculative_pools).snapshot()
    decisions = [decide(features(**fields), POLICY, flags, draw, model, rng) for _ in range(n)]
    return Counter(d.pool for d in decisions), decisions


CHOICE_CASES = [
    # (id, model, share of the decisions that go to `pool`, at least)
    ("cold start follows the priors (speculative is faster per token)", None, "speculative", 0.6),
    ("a pool measured faster wins", lambda: measured(speculative=SLOW, standard=FAST), "standard", 0.97),
    ("the other way round", lambda: measured(speculative=FAST, standard=SLOW), "speculative", 0.97),
    # ten times slower than its priors: so is the other pool's prior, which keeps its 2x against speculation
    ("one pool measured, the other on priors scaled to it", lambda: measured(speculative=(0.5, 0.05)),
     "speculative", 0.6),
]


@pytest.mark.parametrize("make,pool,share", [c[1:] for c in CHOICE_CASES], ids=[c[0] for c in CHOICE_CASES])
def test_the_predicted_fastest_pool_takes_most_requests(make, pool, share):
    counts, decisions = choices(make() if make else LatencyModel(POLICY.schedules))
    assert counts[pool] >= share * len(decisions), counts
    assert all(d.fastest is not None and d.fastest.best == pool for d in decisions), "the mean agrees"


def test_without_a_generator_the_mean_decides_and_nothing_explores():
    decision = decide(features(), POLICY, FlagStore(POLICY.speculative_pools).snapshot())
    assert (decision.pool, decision.explored) == ("speculative", False)
    candidates = decision.fastest.estimates
    assert [e.sample_s for e in candidates] == [e.predicted.e2e_s for e in candidates]


def test_a_model_with_no_timed_answers_is_still_the_one_read():
    """A model that has learned only acceptance (whole bodies teach no times) holds no
    tables yet; the decision reads it all the same, not a cold model of the priors."""
    model = LatencyModel(POLICY.schedules, clock=lambda: 0.0)
    model.acceptance.observe("speculative", CHAT, 1.0, 4)  # nothing of four drafts accepted
    assert len(model) == 0
    decision = decide(features(), POLICY, FlagStore(POLICY.speculative_pools).snapshot(), 0.5, model)
    spec = next(e for e in decision.fastest.estimates if e.pool == "speculative")
    learned = model.predict("speculative", CHAT, 0, decision.fastest.tokens)
    cold = LatencyModel(POLICY.schedules, clock=lambda: 0.0).predict("speculative", CHAT, 0, decision.fastest.tokens)
    assert spec.predicted == learned
    assert learned.tpot_s > cold.tpot_s, "the learned acceptance makes drafting slower than its prior"


@pytest.mark.parametrize("make,bound", [
    (lambda: measured(speculative=SLOW, standard=FAST), 0.02),  # well measured, far apart: nearly never
    (lambda: LatencyModel(POLICY.schedules), 0.45),  # cold: often, but the priors still lean
])
def test_the_explore_rate_is_bounded_and_reported(make, bound):
    counts, decisions = choices(make(), n=1000)
    explored = [d for d in decisions if d.explored]
    assert len(explored) <= bound * len(decisions)
    assert all(d.pool != d.fastest.best and "explored" in d.reason for d in explored)
    assert all(d.pool == d.fastest.best for d in decisions if not d.explored)


def test_a_cold_start_explores_both_pools():
    counts, _ = choices(LatencyModel(POLICY.schedules))
    assert counts["standard"] > 0 and counts["speculative"] > 0, "priors are uncertain: both get tried"


def flags_with(mode=None, guard=None, classes=()):
    store = FlagStore(POLICY.speculative_pools)
    if guard is not None:
        store.set_guard("speculative", False, guard)
    if mode is not None:
        store.set_mode("speculative", mode)
    if classes:
        store.set_classes("speculative", set(classes))
    return store.snapshot()


OFF_CASES = [
    # (id, flags, draw, pool, probe)
    ("force_off: never, not even probes", lambda: flags_with(mode=Mode.FORCE_OFF), 0.0, "standard", False),
    ("guard off: never above the probe share", lambda: flags_with(guard="low_acceptance"), 0.5, "standard", False),
    ("guard off: the probe share still goes", lambda: flags_with(guard="low_acceptance"), 0.01, "speculative",
     True),
    ("class off: never for that class", lambda: flags_with(classes=[CHAT]), 0.5, "standard", False),
]


@pytest.mark.parametrize("make,draw,pool,probe", [c[1:] for c in OFF_CASES], ids=[c[0] for c in OFF_CASES])
def test_a_flagged_off_pool_never_wins_even_when_measured_fastest(make, draw, pool, probe):
    counts, decisions = choices(measured(speculative=FAST, standard=SLOW), n=200, flags=make(), draw=draw)
    assert counts == Counter({pool: 200})
    assert all(d.probe == probe for d in decisions)
    if not probe:
        assert all("'speculative' is off" in d.reason and "speculative" not in d.chain for d in decisions)


def test_a_class_taken_off_leaves_other_classes_their_candidates():
    flags = flags_with(classes=["code/greedy"])
    model = measured(speculative=FAST, standard=SLOW)
    counts, _ = choices(model, n=100, flags=flags)
    assert counts["speculative"] >= 95


def test_the_header_and_a_fixed_rule_above_still_win():
    model, rng = measured(speculative=FAST, standard=SLOW), random.Random(1)
    flags = FlagStore(POLICY.speculative_pools).snapshot()
    header = decide(features(route="other"), POLICY, flags, 0.5, model, rng)
    pinned = decide(features(model="pinned"), POLICY, flags, 0.5, model, rng)
    assert (header.pool, header.rule, header.fastest) == ("other", "header", None)
    assert (pinned.pool, pinned.rule, pinned.fastest) == ("other", "pinned", None)


def test_the_chain_is_the_chosen_pool_then_the_others_by_prediction_then_its_fallbacks():
    model = measured(speculative=FAST, standard=(0.2, 0.05), other=(0.05, 0.005))
    decision = decide(features(model="any"), POLICY, FlagStore(POLICY.speculative_pools).snapshot(), 0.5, model)
    assert decision.pool == "speculative"
    assert decision.chain == ("speculative", "other", "standard")
    assert [e.pool for e in decision.fastest.estimates] == ["speculative", "other", "standard"]
    only_two = decide(features(), POLICY, FlagStore(POLICY.speculative_pools).snapshot(), 0.5, model)
    assert only_two.chain == ("speculative", "standard"), "candidates: [speculative, standard]"


def test_expected_tokens_are_max_tokens_capped_by_the_typical_output():
    model = measured(speculative=FAST, standard=SLOW)
    flags = FlagStore(POLICY.speculative_pools).snapshot()
    short = decide(features(max_tokens=10), POLICY, flags, 0.5, model).fastest
    long = decide(features(max_tokens=100_000), POLICY, flags, 0.5, model).fastest
    assert (short.tokens, long.tokens) == (10, POLICY.spec.routing.typical_output_tokens)
    e2e = short.chosen.predicted
    assert e2e.e2e_s == pytest.approx(e2e.ttft_s + 10 * e2e.tpot_s)


def test_a_burst_that_counts_its_own_decisions_splits_between_identical_pools():
    """Each decision is counted in its pool's load before the next one is made
    (as the gateway's lease does): of two pools measured nearly alike, the
    slightly faster one does not take the whole burst."""
    model = measured(speculative=FAST, standard=(FAST[0] * 1.1, FAST[1] * 1.1))
    rng, flags, load = random.Random(3), FlagStore(()).snapshot(), {"speculative": 0, "standard": 0}
    for _ in range(32):
        load[decide(features(load=dict(load)), POLICY, flags, 0.5, model, rng).pool] += 1
    assert min(load.values()) >= 8, load
    herd = Counter(decide(features(load={}), POLICY, flags, 0.5, model, rng).pool for _ in range(32))
    assert herd["speculative"] >= 30, "a burst that does not count itself herds onto one pool"


@pytest.mark.parametrize("rule,message", [
    ("{name: r, route: fastest, candidates: [nope]}", "rules[0].candidates[0]: unknown pool 'nope'"),
    ("{name: r, route: standard, candidates: [standard]}", "candidates go with route: fastest only"),
    ("{name: r, route: nope}", "unknown pool 'nope'"),
])
def test_policy_checks_fastest_rules(rule, message):
    text = ("version: 1\npools:\n  standard: {kind: standard, endpoints: [{url: 'http://127.0.0.1:2'}]}\n"
            f"rules:\n  - {rule}\n")
    with pytest.raises(PolicyError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_policy(text)


def test_fastest_is_a_route_not_a_pool_name_and_candidates_are_taken_once():
    pool = "{kind: standard, endpoints: [{url: 'http://127.0.0.1:2'}]}"
    with pytest.raises(PolicyError, match="'fastest' is a route, not a pool name"):
        parse_policy(f"version: 1\npools:\n  fastest: {pool}\nrules:\n  - {{name: r, route: fastest}}\n")
    policy = parse_policy(f"version: 1\npools:\n  a: {pool}\n  b: {pool}\n"
                          "rules:\n  - {name: r, route: fastest, candidates: [b, a, b]}\n")
    assert policy.rules[0].candidates == ("b", "a")


STAGGERED = parse_policy("""
version: 1
pools:
  late: {kind: dynamic, speculation_schedule: [[1, 16, 4], [17, 17, 0]], endpoints: [{url: "http://127.0.0.1:1"}],
         fallback: early}
  early: {kind: dynamic, speculation_schedule: [[1, 8, 4], [9, 9, 0]], endpoints: [{url: "http://127.0.0.1:2"}]}
rules:
  - {name: default, route: fastest}
""")


def staggered_flags(*off: str, mode: Mode | None = None):
    store = FlagStore(STAGGERED.speculative_pools)
    for pool in off:
        store.set_guard(pool, False, "low_acceptance")
        if mode is not None:
            store.set_mode(pool, mode)
    return store.snapshot()


def staggered(flags, load, n=200):
    model = LatencyModel(STAGGERED.schedules, clock=lambda: 0.0)
    for pool, tpot in (("late", 0.02), ("early", 0.04)):  # the pool the guard turned off is the faster one
        for _ in range(50):
            model.observe(pool, CHAT, load.get(pool, 0), 0.05, tpot)
    rng = random.Random(3)
    request = extract_features(body(), "chat", STAGGERED.defaults, STAGGERED.classifier, load)
    decisions = [decide(request, STAGGERED, flags, 0.5, model, rng) for _ in range(n)]
    return Counter(d.pool for d in decisions), decisions


STAGGERED_CASES = [
    # (id, pools the guard turned off, loads, mode, who may win, whether the off pool stays a candidate)
    ("every other candidate drafts: the off pool stays", ("late",), {}, None, {"late"}, True),
    ("both off, both draft: both stay", ("late", "early"), {}, None, {"late"}, True),
    ("the other decodes plainly past its switch: the off pool goes", ("late",), {"early": 8}, None, {"early"},
     False),
    ("force_off is the operator's: it goes whatever the others draft", ("late",), {}, Mode.FORCE_OFF, {"early"},
     False),
]


@pytest.mark.parametrize("off,load,mode,winners,kept", [c[1:] for c in STAGGERED_CASES],
                         ids=[c[0] for c in STAGGERED_CASES])
def test_a_guard_verdict_leaves_a_pool_out_only_for_one_that_decodes_plainly(off, load, mode, winners, kept):
    counts, decisions = staggered(staggered_flags(*off, mode=mode), load)
    assert set(counts) == winners
    for d in decisions:
        assert ("late" in [e.pool for e in d.fastest.estimates]) == kept
        assert ("'late' is off" in d.reason) and (("but kept" in d.reason) == kept)


def test_the_thompson_draws_normal_is_a_standard_normal():
    rng = random.Random(7)
    draws = [normal(rng) for _ in range(20000)]
    assert abs(statistics.fmean(draws)) < 0.03 and abs(statistics.pstdev(draws) - 1.0) < 0.03
    beyond = sum(abs(d) > 1.96 for d in draws) / len(draws)  # a normal's tails, not a uniform's or a cut one's
    assert 0.04 < beyond < 0.06 and min(draws) < -3 < 3 < max(draws)
