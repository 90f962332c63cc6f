"""What each answer teaches: the latency model its times and acceptance, the acceptance
gauge, and, with shared state, the other replicas (gateway/state/shared_learning.py).

A streamed answer teaches the latency model its TTFT and TPOT, and any answer its class's
acceptance where the backend reported it. A whole body teaches no times: its one time cannot
be split into the two without a guess, and E2E over tokens would pass the first token's wait
off as decoding. An answer of a domain the policy does not define teaches nothing. Every
answer comes through here once, so the module is compiled with the request path.
"""

from __future__ import annotations

from gateway.decide.latency import LatencyModel
from gateway.loop_metrics import GaugeChild
from gateway.metrics import Children
from gateway.state.shared_learning import Observation, SharedLearning
from gateway.upstream.meter import Measurement
from gateway.upstream.runtime import Runtime


class AnswerLearner:
    """A sink of the recorder's (upstream/exchange.py). `latency` is the app's model: a reloaded
    policy with other priors replaces it here too."""

    def __init__(self, latency: LatencyModel, runtime: Runtime, acceptance: Children[GaugeChild],
                 shared: SharedLearning | None = None) -> None:
        self.latency = latency
        self.runtime = runtime  # the policy in force: which pools report acceptance
        self.acceptance = acceptance  # the gauge's children, set on every speculative answer
        self.shared = shared

    def observe(self, measurement: Measurement) -> None:
        cls = measurement.traffic_class
        if cls is None:
            return
        latency, pool = self.latency, measurement.pool
        latency.answered(pool, measurement.tokens)
        drafting = measurement.drafting
        per_step, drafts = (None, None) if drafting is None else (drafting.per_step, drafting.drafts)
        if not measurement.streamed:
            if drafts is not None:
                latency.observe(pool, cls, measurement.load, None, None, per_step, drafts)
            return
        latency.observe(pool, cls, measurement.load, measurement.ttft_s, measurement.tpot_s, per_step, drafts,
                        measurement.batch)
        if per_step is not None and pool in self.runtime.policy.speculative_pools:
            self.acceptance(pool, cls).set(latency.acceptance.rate(pool, cls))
        if self.shared is not None:  # shared with the other replicas at the next flush
            self.shared.record(Observation(pool, cls, measurement.load, measurement.ttft_s, measurement.tpot_s))
