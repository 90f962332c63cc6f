"""The Prometheus metrics of the requests that wait for a slot (queue.py).

Kept beside the queue so the upstream stage owns them; the app hands its
registry in (`QueueMetrics(metrics.registry)`) so they are exported with the
rest. Labels are bounded: pools come from the policy, outcomes from `OUTCOMES`,
priority tiers from `TIERS` (low < 0, normal 0, high > 0), shed reasons from
`SHED_REASONS`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.loop_metrics import LoopCounter
from gateway.metrics import Children
from gateway.policy.priority import tier

OUTCOMES = ("served", "full", "evicted", "timeout", "cancelled", "failed")
SHED_REASONS = ("full", "evicted", "below_threshold")
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
        self.admitted_by_tier = LoopCounter("specgate_priority_admitted", "Requests that got a slot, by routed pool "
                                        "and priority tier (low, normal, high)", ["pool", "tier"], registry=r)
        self.queued_by_tier = Counter("specgate_priority_queued", "Requests that waited for a slot, by routed "
                                      "pool and priority tier", ["pool", "tier"], registry=r)
        self.shed_by_tier = Counter("specgate_priority_shed", "Requests answered 429 for their priority, by "
                                    "routed pool, priority tier and reason (full, evicted, below_threshold)",
                                    ["pool", "tier", "reason"], registry=r)
        self.seconds_by_tier = Histogram("specgate_priority_wait_seconds", "Time a request waited for a slot, "
                                         "by routed pool and priority tier", ["pool", "tier"],
                                         buckets=WAIT_BUCKETS, registry=r)
        self._admitted = Children(self.admitted_by_tier)

    def waiting(self, pool: str, count: int) -> None:
        self.now.labels(pool).set(count)

    def waited(self, pool: str, outcome: str, seconds: float | None) -> None:
        """`seconds` is None when the request was refused without waiting."""
        self.outcomes.labels(pool, outcome).inc()
        if seconds is not None:
            self.seconds.labels(pool).observe(seconds)

    def admitted(self, pool: str, priority: int) -> None:
        """Once per request: the labelled child is looked up once per pool and tier."""
        self._admitted(pool, tier(priority)).inc()

    def queued(self, pool: str, priority: int, seconds: float) -> None:
        """A request that waited `seconds`, however its wait ended."""
        self.queued_by_tier.labels(pool, tier(priority)).inc()
        self.seconds_by_tier.labels(pool, tier(priority)).observe(seconds)

    def shed(self, pool: str, priority: int, reason: str) -> None:
        self.shed_by_tier.labels(pool, tier(priority), reason).inc()
