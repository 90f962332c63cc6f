"""The gateway's Prometheus metrics and the registry they are exported from.

The waiting queue's metrics live beside the queue (`gateway/upstream/queue_metrics.py`)
and register into this registry; the scrape source (`gateway/control/signals/scrape.py`)
uses prometheus_client only to parse what backends export.

The metrics the request path updates are loop metrics (`gateway/loop_metrics.py`:
plain numbers, no lock, the same samples); the rest are prometheus_client's.

Each app owns a `GatewayMetrics` with its own registry (no global default
registry), so several gateways can live in one process, as tests do. Label
values are bounded: pools, rules and endpoints come from the policy, codes
from HTTP.
"""

from __future__ import annotations

from typing import Generic

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gateway.loop_metrics import C, LoopCounter, LoopGauge, LoopHistogram, LoopMetric

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class Children(Generic[C]):
    """A labelled loop metric's children, each bound once. `.labels(...)` checks and
    converts its values on every call; the request path asks for the same few
    children again and again, so it looks them up here. Label values are
    bounded (above), so this dict is too."""

    __slots__ = ("_bound", "metric")
    metric: LoopMetric[C]
    _bound: dict[tuple[str, ...], C]

    def __init__(self, metric: LoopMetric[C]) -> None:
        self.metric = metric
        self._bound = {}

    def __call__(self, *values: str) -> C:
        child = self._bound.get(values)
        if child is None:
            child = self._bound[values] = self.metric.labels(*values)
        return child


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = LoopCounter("specgate_requests", "Requests answered, by pool, rule, status code and API "
                                "(chat, completions, messages, responses, passthrough)",
                                ["pool", "rule", "code", "api"], registry=r)
        self.duration = LoopHistogram("specgate_request_duration_seconds", "Whole request time",
                                  ["pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttfb = LoopHistogram("specgate_time_to_first_byte_seconds",
                              "Time until the first response byte from the backend",
                              ["pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = LoopGauge("specgate_in_flight", "Requests being served, by pool", ["pool"], registry=r)
        self.upstream_errors = Counter("specgate_upstream_errors", "Backend failures, by kind",
                                       ["pool", "kind"], registry=r)
        self.retries = Counter("specgate_retries", "Requests retried on another endpoint", ["pool"],
                               registry=r)
        self.endpoint_healthy = Gauge("specgate_endpoint_healthy", "1 when the endpoint takes traffic",
                                      ["pool", "endpoint"], registry=r)
        self.speculative_enabled = Gauge("specgate_speculative_enabled",
                                         "1 when speculative routing to the pool is on", ["pool"],
                                         registry=r)
        self.flag_flips = Counter("specgate_flag_flips", "Speculation flag changes", ["pool", "reason"],
                                  registry=r)
        self.guard_up = Gauge("specgate_guard_up", "1 when the guard's last check read its metrics",
                              registry=r)
        self.guard_leader = Gauge("specgate_guard_leader",
                                  "1 while this process's guard leads (runs the checks); 0 while it follows",
                                  registry=r)
        self.policy_reloads = Counter("specgate_policy_reloads", "Policy reloads, by result",
                                      ["result"], registry=r)
        self.route_decisions = LoopCounter("specgate_route_decisions",
                                       "Routing decisions, by pool, rule, whether the choice explored, and API",
                                       ["pool", "rule", "explored", "api"], registry=r)
        self.predicted_e2e = LoopHistogram("specgate_predicted_e2e_seconds",
                                       "Predicted end-to-end time of the pool a fastest route chose",
                                       ["pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.overhead = LoopHistogram("specgate_overhead_seconds",
                                  "Time spent in the gateway before the backend request is sent",
                                  buckets=OVERHEAD_BUCKETS, registry=r)

        self._add_shared_state(r)
        self._add_capture(r)
        self._add_admission(r)

    def _add_admission(self, r: CollectorRegistry) -> None:
        """Requests held at the gateway while every candidate is past its objective (docs/routing.md)."""
        self.admission_held = Gauge("specgate_admission_held", "Requests held at the gateway now", registry=r)
        self.admission_holds = Counter("specgate_admission_holds",
                                       "Holds at the gateway, by how they ended: released (a lease came back) "
                                       "or budget (waiting stopped paying; admitted as it was)",
                                       ["outcome"], registry=r)
        self.admission_wait = Histogram("specgate_admission_wait_seconds", "Time a held request waited",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.acceptance = LoopGauge("specgate_acceptance_rate",
                                "Learned per-token draft acceptance, by pool and traffic class",
                                ["pool", "class"], registry=r)

    def _add_shared_state(self, r: CollectorRegistry) -> None:
        """What several gateways sharing a Redis report (docs/state.md)."""
        self.state_up = Gauge("specgate_state_up",
                              "1 when the shared state store (Redis) answered the last command", registry=r)
        self.state_configured = Gauge("specgate_state_configured",
                                      "1 when SPECGATE_STATE_URL names a shared state store; 0: one process "
                                      "decides alone (specgate_state_up is 0 then too)", registry=r)
        self.state_errors = Counter("specgate_state_errors",
                                    "Shared state store commands that failed, by the part that ran them",
                                    ["part"], registry=r)
        self.fleet_replicas = Gauge("specgate_fleet_replicas",
                                    "Other live replicas whose in-flight counts routing adds (shared state)",
                                    registry=r)
        self.shared_observations = Counter("specgate_shared_observations",
                                           "Latency observations shared with the other replicas, by direction",
                                           ["direction"], registry=r)

    def _add_capture(self, r: CollectorRegistry) -> None:
        """Prompt capture for draft training (docs/drafts.md)."""
        self.capture_sampled = Counter("specgate_capture_sampled", "Prompts sampled for capture", registry=r)
        self.capture_written = Counter("specgate_capture_written", "Captured prompts written, scrubbed",
                                       registry=r)
        self.capture_dropped = Counter("specgate_capture_dropped",
                                       "Prompts not captured: queue_full, too_large, error, no_text", ["reason"],
                                       registry=r)
        self.capture_worker_died = Counter("specgate_capture_worker_died",
                                           "Scrubbing processes that died (killed, out of memory); "
                                           "the next batch starts another", registry=r)
        self.capture_redactions = Counter("specgate_capture_redactions",
                                          "PII and secrets replaced in captured prompts, by kind", ["kind"],
                                          registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
