"""`Children`: a labelled metric's children bound once, counting into the same series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.loop_metrics import LoopCounter
from gateway.metrics import Children


def test_a_bound_child_is_the_metrics_own_and_counts_into_its_series():
    registry = CollectorRegistry()
    requests = LoopCounter("requests", "help", ["pool", "code"], registry=registry)
    children = Children(requests)
    children("speculative", "200").inc()
    children("speculative", "200").inc()
    children("standard", "502").inc()
    requests.labels("speculative", "200").inc()  # the same child, reached the usual way
    assert children("speculative", "200") is requests.labels("speculative", "200")
    assert registry.get_sample_value("requests_total", {"pool": "speculative", "code": "200"}) == 3
    assert registry.get_sample_value("requests_total", {"pool": "standard", "code": "502"}) == 1
