"""Loop metrics export what prometheus_client's own metrics export for the same updates."""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from gateway.loop_metrics import LoopCounter, LoopGauge, LoopHistogram

BUCKETS = (0.005, 0.01, 0.25, 1, 30)
CREATED = re.compile(rb"^(\w+_created(?:\{[^}]*\})?) [0-9.e+]+$", re.M)


def exported(registry: CollectorRegistry) -> bytes:
    """The exposition, each `_created` sample's time left out (the two were made apart)."""
    return CREATED.sub(rb"\1 T", generate_latest(registry))


def both(kinds: tuple[type, type], *args: object, **kwargs: object) -> tuple[CollectorRegistry, CollectorRegistry,
                                                                              list[object]]:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    metrics = [kinds[0](*args, registry=theirs, **kwargs), kinds[1](*args, registry=ours, **kwargs)]
    return theirs, ours, metrics


def test_a_counter_with_labels_exports_the_same_series() -> None:
    theirs, ours, metrics = both((Counter, LoopCounter), "specgate_requests", "Requests answered", ["pool", "code"])
    for metric in metrics:
        metric.labels("speculative", "200").inc()
        metric.labels("speculative", "200").inc(2.5)
        metric.labels("standard", 502).inc()  # a value is its str
    assert exported(ours) == exported(theirs)
    assert ours.get_sample_value("specgate_requests_total", {"pool": "speculative", "code": "200"}) == 3.5
    assert ours.get_sample_value("specgate_requests_created", {"pool": "standard", "code": "502"}) > 0


def test_a_counter_refuses_to_go_down_and_labels_must_be_all_given() -> None:
    counter = LoopCounter("c", "help", ["pool"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("a").inc(-1)
    with pytest.raises(ValueError, match="takes 1 label values, not 2"):
        counter.labels("a", "b")
    with pytest.raises(ValueError, match="call .labels"):
        counter.inc()


def test_a_gauge_exports_the_same_series() -> None:
    theirs, ours, metrics = both((Gauge, LoopGauge), "specgate_in_flight", "Requests being served", ["pool"])
    for metric in metrics:
        metric.labels("a").inc(3)
        metric.labels("a").dec()
        metric.labels("b").set(7)
    assert exported(ours) == exported(theirs)
    assert ours.get_sample_value("specgate_in_flight", {"pool": "a"}) == 2


@pytest.mark.parametrize("values", [
    [0.001, 0.005, 0.0050001, 0.01, 0.3, 1, 29.9, 30, 31, 1e9],  # on a bound: that bucket, as theirs
    [-1.0, 0.0, math.inf, float("nan")],  # a NaN only moves the sum, in theirs and ours
])
def test_a_histogram_places_each_value_in_the_same_bucket(values: list[float]) -> None:
    theirs, ours, metrics = both((Histogram, LoopHistogram), "specgate_request_duration_seconds", "Whole request time",
                                 ["pool"], buckets=BUCKETS)
    for metric in metrics:
        for value in values:
            metric.labels("a").observe(value)
    assert exported(ours) == exported(theirs)


def test_a_histogram_without_labels_exports_the_same_series() -> None:
    theirs, ours, metrics = both((Histogram, LoopHistogram), "specgate_overhead_seconds", "Time in the gateway",
                                 buckets=BUCKETS)
    for metric in metrics:
        metric.observe(0.002)
        metric.observe(0.5)
    assert exported(ours) == exported(theirs)
    assert ours.get_sample_value("specgate_overhead_seconds_count") == 2


def test_created_series_follow_prometheus_clients_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "True")
    registry = CollectorRegistry()
    LoopCounter("c", "help", registry=registry).inc()
    LoopHistogram("h", "help", registry=registry, buckets=BUCKETS).observe(1)
    text = generate_latest(registry)
    assert b"c_total 1.0" in text and b"h_count 1.0" in text and b"_created" not in text


def test_a_name_registered_twice_is_refused_as_prometheus_client_refuses_it() -> None:
    registry = CollectorRegistry()
    Counter("specgate_requests", "help", registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        LoopCounter("specgate_requests", "help", registry=registry)
