"""Counters, gauges and histograms for the request path: plain numbers, no lock.

prometheus_client's metrics are built for threads: every increment takes a
lock, every call checks that the metric is observable, and a histogram
walks its buckets in Python. The request path updates about a dozen of
them a request, all from the event loop's thread, and that was more than a
twelfth of what the gateway's own code interpreted per request. These keep
each child's numbers as attributes that an update adds to, and place a
histogram's observation with `bisect`.

They are registered in a `CollectorRegistry` like any metric, and export
the same samples prometheus_client's own would (`_total` and `_created` of a
counter, a histogram's cumulative `_bucket`s with their `le`, `_count`,
`_sum` and `_created`), so a scrape cannot tell them apart. Every update must
come from one thread (the event loop's); a scrape may read from another, and
then sees each number as one update left it.
"""

from __future__ import annotations

import math
import os
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import ClassVar, Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString


def _created_series() -> bool:
    """Whether counters and histograms export `_created`: as prometheus_client decides it."""
    return os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1", "t")


class CounterChild:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class GaugeChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class HistogramChild:
    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # ascending, the last +Inf
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        """Into the first bucket whose bound is at least `amount`, as prometheus_client places it
        (a NaN goes into none of them, and only into the sum)."""
        self.sum += amount
        if amount == amount:  # the last bound is +Inf: every number has a bucket
            self.counts[bisect_left(self.bounds, amount)] += 1


C = TypeVar("C", CounterChild, GaugeChild, HistogramChild)


class LoopMetric(Generic[C]):
    """A metric's name, help and label names, and a child per label values."""

    kind: ClassVar[str] = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: CollectorRegistry | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], C] = {}
        self._created = _created_series()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: object) -> C:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes {len(self.labelnames)} label values, not {len(values)}")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._child()
        return child

    def _child(self) -> C:
        raise NotImplementedError

    def _only(self) -> C:
        """The child of a metric without labels."""
        if self.labelnames:
            raise ValueError(f"{self.name} has labels {self.labelnames}: call .labels(...) first")
        return self.labels()

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for values, child in list(self._children.items()):
            self._samples(metric, dict(zip(self.labelnames, values, strict=True)), child)
        return [metric]

    def _samples(self, metric: Metric, labels: dict[str, str], child: C) -> None:
        raise NotImplementedError


class LoopCounter(LoopMetric[CounterChild]):
    kind: ClassVar[str] = "counter"

    def _child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def _samples(self, metric: Metric, labels: dict[str, str], child: CounterChild) -> None:
        metric.add_sample(self.name + "_total", labels, child.value)
        if self._created:
            metric.add_sample(self.name + "_created", labels, child.created)


class LoopGauge(LoopMetric[GaugeChild]):
    kind: ClassVar[str] = "gauge"

    def _child(self) -> GaugeChild:
        return GaugeChild()

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._only().dec(amount)

    def set(self, value: float) -> None:
        self._only().set(value)

    def _samples(self, metric: Metric, labels: dict[str, str], child: GaugeChild) -> None:
        metric.add_sample(self.name, labels, child.value)


class LoopHistogram(LoopMetric[HistogramChild]):
    kind: ClassVar[str] = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: CollectorRegistry | None = None, *, buckets: Sequence[float]) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        if len(set(bounds)) != len(bounds) or any(b != b for b in bounds):
            raise ValueError(f"{name}: buckets must be distinct numbers")
        self.bounds = tuple(bounds)
        self._le = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]  # as its own le
        super().__init__(name, documentation, labelnames, registry)

    def _child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def observe(self, amount: float) -> None:
        self._only().observe(amount)

    def _samples(self, metric: Metric, labels: dict[str, str], child: HistogramChild) -> None:
        total = 0
        for le, count in zip(self._le, list(child.counts), strict=True):
            total += count
            metric.add_sample(self.name + "_bucket", {**labels, "le": le}, float(total))
        metric.add_sample(self.name + "_count", labels, float(total))
        metric.add_sample(self.name + "_sum", labels, child.sum)
        if self._created:
            metric.add_sample(self.name + "_created", labels, child.created)
