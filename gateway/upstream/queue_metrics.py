"""The Prometheus metrics of the requests that wait for a slot (queue.py).

Kept beside the queue so the upstream stage owns them; the app hands its
registry in (`QueueMetrics(metrics.registry)`) so they are exported with the
rest. Labels are bounded: pools come from the policy, outcomes from `OUTCOMES`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

OUTCOMES = ("served", "full", "timeout", "cancelled", "failed")
WAIT_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class QueueMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.now = Gauge("specgate_queue_waiting", "Requests waiting for a slot now, by pool",
                         ["pool"], registry=r)
        self.outcomes = Counter("specgate_queue_waits", "Waits for a slot, by routed pool and how they ended "
                                "(served, full, timeout, cancelled, failed)", ["pool", "outcome"], registry=r)
        self.seconds = Histogram("specgate_queue_seconds", "Time a request waited for a slot, by routed pool",
                                 ["pool"], buckets=WAIT_BUCKETS, registry=r)

    def waiting(self, pool: str, count: int) -> None:
        self.now.labels(pool).set(count)

    def waited(self, pool: str, outcome: str, seconds: float | None) -> None:
        """`seconds` is None when the request was refused without waiting."""
        self.outcomes.labels(pool, outcome).inc()
        if seconds is not None:
            self.seconds.labels(pool).observe(seconds)
