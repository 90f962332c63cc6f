"""The arithmetic both signal sources share, and how pools are selected in PromQL."""

from __future__ import annotations

import math

import pytest

from gateway.control.signals import DIALECTS, Target, address
from gateway.control.signals.model import Tally, compute, histogram_quantile, merge
from gateway.control.signals.prometheus import selector, series
from gateway.control.signals.scrape import increase, parse_exposition, tally_window
from gateway.policy.guard import GuardSpec

INF = math.inf


@pytest.mark.parametrize("buckets, expected", [
    ({0.1: 0, 0.2: 10, INF: 10}, 0.1 + 0.1 * 0.95),  # interpolated inside (0.1, 0.2]
    ({0.1: 10, 0.2: 10, INF: 10}, 0.095),  # the lowest bucket starts at 0
    ({0.1: 0, 0.2: 0, INF: 10}, 0.2),  # in +Inf: the highest finite bound
    ({0.1: 0, INF: 0}, None),  # no observations
    ({}, None),
    ({0.1: 5, 0.2: 4, INF: 10}, 0.2),  # non-monotonic counts are evened out first
])
def test_histogram_quantile_follows_prometheus(buckets, expected):
    result = histogram_quantile(0.95, buckets)
    assert result == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize("points, start, end, expected", [
    ([(0, 10), (10, 20)], 0, 10, 10),  # samples on the window's edges
    ([(1, 10), (9, 18)], 0, 10, 10),  # extrapolated to the edges (gaps under 1.1 intervals)
    ([(1, 100), (2, 110), (3, 5)], 0, 4, 30),  # reset: 10 + 5 over 2 s, extrapolated to 4 s
    ([(5, 1)], 0, 10, None),  # one sample: no increase
])
def test_increase_follows_prometheus(points, start, end, expected):
    result = increase(points, start, end)
    assert result == (pytest.approx(expected) if expected is not None else None)


def test_increase_does_not_extrapolate_below_zero():
    # 0 -> 10 over [5, 10]: extrapolating left to t=0 would start below zero
    assert increase([(5, 0), (10, 10)], 0, 10) == pytest.approx(10)


def test_selector_by_endpoints_by_pool_and_escaped_names():
    target = Target("spec.pool", "vllm", ("http://10.0.0.1:8001", "https://gpu-a"))
    assert target.addresses == ("10.0.0.1:8001", "gpu-a:443") and address("http://h") == "h:80"
    assert selector(target, GuardSpec()) == r'instance=~"10\\.0\\.0\\.1:8001|gpu\\-a:443"'
    by_pool = GuardSpec.model_validate({"target": {"label": "pool", "value": "{pool}"}})
    assert selector(target, by_pool) == r'pool=~"spec\\.pool"'
    assert series("vllm:num_requests_running", 'pool=~"x"') == \
        '{__name__=~"vllm[:_]num_requests_running",pool=~"x"}'


EXPOSITION = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm_spec_decode_num_drafts_total{engine="0"} 10
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0"} 30
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 2
# TYPE something_else counter
something_else_total 5
"""


def test_parse_keeps_wanted_names_and_undoes_escaped_colons():
    values = parse_exposition(EXPOSITION, DIALECTS["vllm"].metric_names())
    names = {name for name, _ in values}
    assert names == {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                     "vllm:num_requests_running"}


def test_sglang_gauges_average_over_the_window():
    dialect = DIALECTS["sglang"]
    samples = [(t, {("sglang:spec_accept_rate", ()): rate, ("sglang:spec_accept_length", ()): 2.5,
                    ("sglang:generation_tokens_total", ()): 100.0 * t, ("sglang:num_running_reqs", ()): 3.0})
               for t, rate in ((1, 0.5), (2, 0.7), (3, 0.6))]
    signals = compute(tally_window(samples, dialect, 0, 3), dialect)
    assert signals.acceptance_rate == pytest.approx(0.6) and signals.mean_accepted_length == 2.5
    assert signals.volume_tokens > 200 and signals.running == 3


def test_pool_signals_from_endpoints():
    a = Tally(counters={"drafts": 10, "draft_tokens": 30, "accepted": 24}, per_position={0: 9, 1: 8, 2: 7},
              latest={"running": 2, "waiting": 1})
    b = Tally(counters={"drafts": 10, "draft_tokens": 30, "accepted": 6}, per_position={0: 3, 1: 2, 2: 1},
              latest={"running": 5})
    pool = compute(merge([a, b]), DIALECTS["vllm"])
    assert pool.acceptance_rate == pytest.approx(0.5) and pool.mean_accepted_length == pytest.approx(2.5)
    assert pool.per_position == pytest.approx((0.6, 0.5, 0.4))
    assert pool.reported_load == 8 and pool.volume_tokens == 60


def test_parse_drops_samples_that_are_not_finite():
    text = ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} NaN\n"
            "vllm:num_requests_running{engine=\"1\"} +Inf\nvllm:num_requests_running{engine=\"2\"} 4\n"
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting -Inf\n")
    values = parse_exposition(text, DIALECTS["vllm"].metric_names())
    assert values == {("vllm:num_requests_running", (("engine", "2"),)): 4.0}


def test_rates_are_clamped_to_their_range_and_nothing_comes_out_not_finite():
    # Two series' increases over the same window, extrapolated from samples taken at
    # different instants: a position can count a little more than the drafts.
    tally = Tally(counters={"drafts": 100, "draft_tokens": 300, "accepted": 305},
                  per_position={0: 102.1, 1: 100, 2: -3}, latest={"running": math.inf, "waiting": -2})
    pool = compute(tally, DIALECTS["vllm"])
    assert pool.per_position == (1.0, 1.0, 0.0) and pool.acceptance_rate == 1.0
    assert pool.running is None and pool.waiting == 0 and pool.reported_load == 0
    empty = compute(Tally(counters={"drafts": math.nan, "draft_tokens": math.nan}), DIALECTS["vllm"])
    assert (empty.acceptance_rate, empty.mean_accepted_length, empty.volume_tokens) == (None, None, 0.0)
