"""The latency model per (pool, traffic class): load buckets, convergence, following a
change in time, monotone predictions, bounded memory, priors, Thompson draws."""

from __future__ import annotations

import gc
import json
import math
import random
import statistics
import tracemalloc

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.decide import latency
from gateway.decide.fastest import fastest
from gateway.decide.latency import LatencyModel, LatencyPriors, bucket_label
from gateway.decide.latency_tables import load_bucket
from gateway.policy.features import Features
from gateway.policy.kinds import PoolKind, schedule_of
from gateway.policy.priors import PriorsSpec

CLS = "chat/greedy"
SPECULATIVE = {"spec": schedule_of(PoolKind.SPECULATIVE, 3)}
# chat at T=0 accepts 0.72 a token by the default priors: a 3-token draft yields (1 - a^4) / (1 - a) a step
CHAT_PER_STEP = (1 - 0.72 ** 4) / (1 - 0.72)
DRAFTING_STEP = 0.0103 * 1.3  # a step that drafts 3 tokens at 0.1 of a plain step each


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def feed(model: LatencyModel, clock: Clock, pool: str, load: int, ttft: float, tpot: float, count: int,
         every_s: float, noise: float = 0.0, rng: random.Random | None = None) -> None:
    """`count` answers `every_s` apart, each measure off by up to +-noise (relative)."""
    rng = rng or random.Random(5)
    for _ in range(count):
        clock.now += every_s
        model.observe(pool, CLS, load, ttft * (1 + rng.uniform(-noise, noise)),
                      tpot * (1 + rng.uniform(-noise, noise)))


def off(value: float, truth: float) -> float:
    return abs(value / truth - 1)


@pytest.mark.parametrize("load, bucket, label", [
    (-3, 0, "0"), (0, 0, "0"), (1, 1, "1"), (2, 2, "2-3"), (3, 2, "2-3"), (4, 3, "4-7"), (7, 3, "4-7"),
    (8, 4, "8-15"), (1023, 10, "512-1023"), (1024, 11, "1024+"), (10**12, 11, "1024+")])
def test_load_buckets_double_and_end_in_an_open_one(load: int, bucket: int, label: str) -> None:
    assert load_bucket(load, 11) == bucket
    assert bucket_label(bucket, 11) == label


@pytest.mark.parametrize("pool, load, ttft, tpot, noise, per_s, count, tolerance", [
    ("standard", 0, 0.2, 0.03, 0.0, 10, 300, 0.01),
    ("spec", 5, 0.1, 0.012, 0.2, 20, 600, 0.02),
    ("standard", 100, 1.5, 0.08, 0.3, 5, 400, 0.04),
    ("spec", 2000, 4.0, 0.3, 0.1, 50, 2000, 0.01),
])
def test_converges_to_a_constant_pool(pool: str, load: int, ttft: float, tpot: float, noise: float,
                                      per_s: float, count: int, tolerance: float) -> None:
    clock = Clock()
    model = LatencyModel(SPECULATIVE, clock=clock)
    feed(model, clock, pool, load, ttft, tpot, count, 1 / per_s, noise)
    got = model.predict(pool, CLS, load, 200)
    assert off(got.ttft_s, ttft) < tolerance
    assert off(got.tpot_s, tpot) < tolerance
    assert off(got.e2e_s, ttft + 200 * tpot) < tolerance
    assert got.samples > 10


@pytest.mark.parametrize("per_s, after_s, tolerance", [
    (2, 40, 0.05), (50, 40, 0.05),  # the same time to follow, whatever the request rate
    (2, 70, 0.015), (50, 70, 0.015),
    (0.5, 40, 0.08),  # a quiet class: 20 samples since the change
])
def test_follows_a_draft_that_degrades_within_tens_of_seconds(per_s: float, after_s: float,
                                                              tolerance: float) -> None:
    clock = Clock()
    model = LatencyModel(SPECULATIVE, clock=clock)
    feed(model, clock, "spec", 4, 0.1, 0.01, int(120 * per_s), 1 / per_s)
    assert off(model.predict("spec", CLS, 4, 100).tpot_s, 0.01) < 0.01
    feed(model, clock, "spec", 4, 0.1, 0.03, int(after_s * per_s), 1 / per_s)
    assert off(model.predict("spec", CLS, 4, 100).tpot_s, 0.03) < tolerance


def predictions(model: LatencyModel, pool: str) -> list[tuple[float, float, float]]:
    loads = [0, 1, 2, 3, 5, 7, 9, 20, 40, 100, 200, 400, 900, 5000]
    return [(p.ttft_s, p.tpot_s, p.e2e_s) for p in (model.predict(pool, CLS, load, 64) for load in loads)]


def assert_non_decreasing(rows: list[tuple[float, float, float]]) -> None:
    for column in range(3):
        values = [row[column] for row in rows]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(values, values[1:], strict=False)), (column, values)


def test_a_pool_measured_faster_under_more_load_is_predicted_no_faster() -> None:
    clock = Clock()
    model = LatencyModel(clock=clock)
    feed(model, clock, "standard", 2, 0.5, 0.05, 50, 0.1)
    feed(model, clock, "standard", 40, 0.2, 0.02, 50, 0.1)  # noise, or a warmer cache: not a law
    rows = predictions(model, "standard")
    assert_non_decreasing(rows)
    low, high = model.predict("standard", CLS, 2, 64), model.predict("standard", CLS, 40, 64)
    assert low.ttft_s == pytest.approx(high.ttft_s)  # pooled, weighted by samples
    assert 0.2 < low.ttft_s < 0.5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["spec", "standard"]), st.integers(0, 3000),
                          st.floats(0.0, 30.0), st.floats(0.0, 2.0), st.floats(0.0, 20.0)),
                min_size=1, max_size=40))
@example([("spec", 0, 0.0, 0.0, 0.0)] * 6 + [("spec", 0, 2.225073858507e-311, 0.0, 0.0), ("standard", 0, 1.0, 0.0, 0.0),
          ("standard", 2, 0.0, 0.0, 0.0)])  # a subnormal TTFT once scaled the priors to inf
def test_predictions_never_fall_as_load_rises(answers: list[tuple[str, int, float, float, float]]) -> None:
    clock = Clock()
    model = LatencyModel(SPECULATIVE, clock=clock)
    for pool, load, ttft, tpot, gap_s in answers:
        clock.now += gap_s
        model.observe(pool, CLS, load, ttft, tpot)
    for pool in ("spec", "standard"):
        assert_non_decreasing(predictions(model, pool))


def model_memory() -> int:
    """Bytes still held that the latency model's module allocated: what the
    rest of the process does meanwhile (pytest, other threads) is left out."""
    gc.collect()
    held = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, latency.__file__)])
    return sum(stat.size for stat in held.statistics("filename"))


@pytest.mark.slow
def test_memory_stays_bounded_whatever_the_classes_and_loads() -> None:
    clock = Clock()
    model = LatencyModel(clock=clock, max_pairs=64)
    early = 0
    tracemalloc.start()
    try:
        for i in range(10**5):
            model.observe("standard", f"class-{i}", i * 7919, 0.1, 0.01)
            if i % 1000 == 0:
                model.predict("standard", f"class-{i}", i, 10)
            if i == 1000:
                early = model_memory()
        late = model_memory()
    finally:
        tracemalloc.stop()
    assert len(model) == 64
    assert late < early * 1.1
    snapshot = model.snapshot()
    assert [pair["class"] for pair in snapshot["pairs"]] == [f"class-{i}" for i in range(10**5 - 64, 10**5)]
    assert {len(pair["ttft"]["samples"]) for pair in snapshot["pairs"]} == {12}


def test_the_least_recently_updated_pair_goes_first() -> None:
    clock = Clock()
    model = LatencyModel(clock=clock, max_pairs=2)
    for cls in ("a", "b", "a", "c"):
        model.observe("standard", cls, 1, 0.1, 0.01)
    assert [pair["class"] for pair in model.snapshot()["pairs"]] == ["a", "c"]


@pytest.mark.parametrize("pool, load, ttft, tpot", [
    ("standard", 0, 0.06, 0.0103),
    ("spec", 0, 0.06, DRAFTING_STEP / CHAT_PER_STEP),
    ("standard", 1, 0.0603, 0.0103 + 0.0003 * 1.5),  # TPOT at a batch of 2-3, which stands at 2.5
    # the plain step of the bucket, times what drafting costs over a plain step at the request's batch of 2
    ("spec", 1, 0.0603, (0.0103 + 0.0003 * 1.5) * (DRAFTING_STEP + 0.0003 * (1 + 3 * 0.8)) / (0.0103 + 0.0003)
     / CHAT_PER_STEP),
])
def test_priors_answer_for_a_pair_with_no_data(pool: str, load: int, ttft: float, tpot: float) -> None:
    model = LatencyModel(SPECULATIVE, clock=Clock())
    got = model.predict(pool, CLS, load, 100)
    assert (got.ttft_s, got.tpot_s, got.samples) == (pytest.approx(ttft), pytest.approx(tpot), 0.0)
    assert got.stddev_e2e == pytest.approx(0.5 * math.hypot(got.ttft_s, 100 * got.tpot_s))
    assert len(model) == 0


def test_prior_speculation_pays_below_the_crossover_and_costs_above() -> None:
    model = LatencyModel(SPECULATIVE, clock=Clock())
    for load, faster in [(0, True), (4, True), (16, True), (128, False), (500, False)]:
        spec, std = model.predict("spec", CLS, load, 100), model.predict("standard", CLS, load, 100)
        assert (spec.tpot_s < std.tpot_s) is faster, load


def test_priors_can_be_set_and_are_checked() -> None:
    spec = PriorsSpec(acceptance={"chat": {"greedy": 0.5}}, draft_cost=0.0)
    model = LatencyModel(SPECULATIVE, priors=LatencyPriors(spec), clock=Clock())
    assert model.predict("spec", CLS, 0, 1).tpot_s == pytest.approx(0.0103 / ((1 - 0.5 ** 4) / 0.5))
    with pytest.raises(ValueError):
        PriorsSpec(ttft_s=0.0)
    with pytest.raises(ValueError, match="unknown band"):
        PriorsSpec(acceptance={"chat": {"warm": 0.5}})
    with pytest.raises(ValueError):
        PriorsSpec(acceptance={"chat": {"greedy": 1.5}})


def test_empty_buckets_borrow_the_neighbours_ratio_to_the_prior() -> None:
    clock = Clock()
    model, cold = LatencyModel(clock=clock), LatencyModel(clock=Clock())
    feed(model, clock, "standard", 1, 2 * cold.predict("standard", CLS, 1, 1).ttft_s, 0.05, 200, 0.05)
    feed(model, clock, "standard", 300, 4 * cold.predict("standard", CLS, 300, 1).ttft_s, 0.05, 200, 0.05)
    between = model.predict("standard", CLS, 20, 1)
    ratio = between.ttft_s / cold.predict("standard", CLS, 20, 1).ttft_s
    assert 2 < ratio < 4
    above = model.predict("standard", CLS, 3000, 1)
    assert above.ttft_s / cold.predict("standard", CLS, 3000, 1).ttft_s == pytest.approx(4, rel=0.02)
    assert between.samples == 0 < model.predict("standard", CLS, 1, 1).samples


def spread(model: LatencyModel, load: int) -> float:
    """The spread of `route: fastest`'s Thompson draws of the E2E of one candidate."""
    rng = random.Random(11)
    features = Features(endpoint="chat", model=None, temperature=0.0, top_p=1.0, max_tokens=100, stream=True, n=1,
                        prompt_chars=100, prompt_tokens=25, tools=False, response_format=False, logprobs=False,
                        domain="chat", load={"spec": load})
    draws = [e.sample_s - e.added_s for _ in range(3000)
             for e in fastest(("spec",), features, CLS, 100, model, rng).estimates]
    assert min(draws) >= 0
    return statistics.stdev(draws)


def test_thompson_draws_narrow_with_samples_and_widen_when_stale() -> None:
    clock = Clock()
    model = LatencyModel(SPECULATIVE, clock=clock)
    spreads = [spread(model, 4)]
    for count in (3, 30, 300):
        feed(model, clock, "spec", 4, 0.1, 0.02, count, 0.01, noise=0.3)
        spreads.append(spread(model, 4))
    assert spreads == sorted(spreads, reverse=True) and spreads[-1] < spreads[0] / 10
    predicted = model.predict("spec", CLS, 4, 100)
    assert spreads[-1] == pytest.approx(predicted.stddev_e2e, rel=0.1)
    clock.now += 60  # six half-lives with nothing new
    assert spread(model, 4) > 3 * spreads[-1]


def test_bad_or_missing_measures_are_left_out() -> None:
    clock = Clock()
    model = LatencyModel(clock=clock)
    model.observe("standard", CLS, 0, math.nan, -1.0)
    model.observe("standard", CLS, 0, math.inf, None)
    model.observe("standard", CLS, 0, None, 0.02)
    pair = model.snapshot()["pairs"][0]
    assert sum(pair["ttft"]["samples"]) == 0
    assert pair["tpot"]["samples"][1] == 1 and pair["tpot"]["observed_s"][1] == 0.02


def test_snapshot_is_json() -> None:
    clock = Clock()
    model = LatencyModel(SPECULATIVE, clock=clock)
    feed(model, clock, "spec", 3, 0.1, 0.01, 5, 0.5)
    decoded = json.loads(json.dumps(model.snapshot()))
    assert decoded["buckets"][:4] == ["0", "1", "2-3", "4-7"]
    assert decoded["priors"]["draft_tokens"] == 3 and decoded["schedules"]["spec"] == [[1, 1 << 30, 3]]
    (pair,) = decoded["pairs"]
    assert (pair["pool"], pair["class"]) == ("spec", CLS)
    assert pair["ttft"]["observed_s"][0] is None and pair["ttft"]["observed_s"][2] == pytest.approx(0.1, rel=0.05)
    assert all(a <= b for a, b in zip(pair["tpot"]["fitted_s"], pair["tpot"]["fitted_s"][1:], strict=False))


def test_a_stale_bucket_slides_toward_what_its_neighbours_see_now() -> None:
    clock = Clock()
    model = LatencyModel(clock=clock)
    for _ in range(100):
        feed(model, clock, "standard", 1, 0.1, 0.01, 1, 0.05)
        feed(model, clock, "standard", 8, 0.1, 0.01, 1, 0.05)
    feed(model, clock, "standard", 8, 0.3, 0.03, 100, 0.05)  # the pool slows; only the busier bucket hears
    assert model.predict("standard", CLS, 1, 100).ttft_s < 0.11
    feed(model, clock, "standard", 8, 0.3, 0.03, 2300, 0.05)  # two minutes on: twelve half-lives
    stale = model.predict("standard", CLS, 1, 100)
    assert stale.ttft_s > 0.25 and stale.tpot_s > 0.02  # the busier bucket's level, in the prior's shape


def test_a_class_with_few_answers_follows_its_pool_in_its_own_proportion() -> None:
    clock = Clock()
    model = LatencyModel(clock=clock)
    for _ in range(50):  # the pool's other traffic maps its curve: 10 ms a token alone, 30 ms at 8
        clock.now += 0.05
        model.observe("standard", "chat/hot", 0, 0.1, 0.01)
        model.observe("standard", "chat/hot", 7, 0.3, 0.03)
    for _ in range(3):  # three answers of a class 1.5x slower, all alone
        clock.now += 0.05
        model.observe("standard", "code/greedy", 0, 0.15, 0.015)
    busy = model.predict("standard", "code/greedy", 7, 100)
    assert busy.tpot_s == pytest.approx(0.045, rel=0.15)  # the pool's shape, the class's level
    assert busy.samples > 0  # the pool's answers vouch for a bucket the class never saw
    unseen = model.predict("standard", "math/greedy", 7, 100)
    assert unseen.tpot_s == pytest.approx(0.03, rel=0.1) and unseen.samples > 0
    cold = LatencyModel(clock=Clock()).predict("standard", "math/greedy", 7, 100)
    assert unseen.stddev_e2e < cold.stddev_e2e / 2


def test_the_pools_curve_goes_stale_like_a_class() -> None:
    clock = Clock()
    model = LatencyModel(clock=clock)
    feed(model, clock, "standard", 0, 0.1, 0.01, 30, 0.05)
    fresh = model.predict("standard", "math/greedy", 0, 100)
    clock.now += 60  # six half-lives with nothing new
    stale = model.predict("standard", "math/greedy", 0, 100)
    assert fresh.samples > 0.9 > 10 * stale.samples
    snapshot = json.loads(json.dumps(model.snapshot()))
    assert [pool["pool"] for pool in snapshot["pools"]] == ["standard"]


def test_an_unmeasured_pool_is_predicted_as_much_slower_than_its_prior_as_the_measured_ones() -> None:
    clock = Clock()
    model, cold = LatencyModel(SPECULATIVE, clock=clock), LatencyModel(SPECULATIVE, clock=Clock())
    prior = cold.predict("spec", CLS, 1, 100)
    feed(model, clock, "spec", 1, 12 * prior.ttft_s, 12 * prior.tpot_s, 20, 0.5)  # CPU backends, GPU priors
    unmeasured = model.predict("standard", CLS, 1, 100)
    assert unmeasured.tpot_s == pytest.approx(12 * cold.predict("standard", CLS, 1, 100).tpot_s, rel=0.05)
    assert unmeasured.ttft_s == pytest.approx(12 * cold.predict("standard", CLS, 1, 100).ttft_s, rel=0.05)
    assert model.snapshot()["prior_scale"]["tpot"] == pytest.approx(12, rel=0.05)


def test_tpot_is_kept_at_the_batch_the_answer_decoded_in() -> None:
    # sent to an idle pool at the start of a burst, it decoded beside 40 others: its TPOT says what
    # a batch of 41 costs, not what an idle pool does
    clock = Clock()
    model = LatencyModel(clock=clock, refit_s=0.0)
    for _ in range(50):
        model.observe("p", "chat/greedy", 0, 0.05, 0.010)
        model.observe("p", "chat/greedy", 0, 0.05, 0.045, batch=41.2)
        clock.now += 0.1
    assert model.predict("p", "chat/greedy", 0, 1).tpot_s == pytest.approx(0.010, rel=0.05)
    assert model.predict("p", "chat/greedy", 40, 1).tpot_s == pytest.approx(0.045, rel=0.05)
    # TTFT stays at the load it was sent at
    assert model.predict("p", "chat/greedy", 0, 1).ttft_s == pytest.approx(0.05, rel=0.05)
    # a mean that is no batch (below one, not finite) falls back to the load it was sent at
    for bad in (0.0, math.nan, math.inf):
        model.observe("q", "chat/greedy", 3, None, 0.02, batch=bad)
    assert model.snapshot()["pools"][-1]["tpot"]["samples"][load_bucket(4, 11)] > 0
