"""The latency model's cold start: TTFT and step-time curves against load, by drafting schedule.

The model learns a pool's *step time*, the time per output token times the
tokens each step yielded, so the curve is the pool's physics whatever the mix
of classes it served; a class's time per output token is the step time over
the tokens per step its acceptance gives at that batch size (acceptance.py).
The curves here are the step times before anything was measured: a plain step
grows by `step_per_seq_s` per sequence; a step that drafts `k` tokens costs
`1 + k * draft_cost` plain steps at batch 1 and each sequence pays for its `k`
extra verified tokens at `verify_cost` of a plain token (gateway/policy/priors.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.decide.acceptance import tokens_per_step
from gateway.policy.kinds import Schedule
from gateway.policy.priors import PriorsSpec


@dataclass(frozen=True, slots=True)
class LatencyPriors:
    spec: PriorsSpec = field(default_factory=PriorsSpec)

    @property
    def weight(self) -> float:
        return self.spec.weight

    @property
    def relative_stddev(self) -> float:
        return self.spec.relative_stddev

    def ttft(self, load: float) -> float:
        return self.spec.ttft_s + load * self.spec.ttft_per_seq_s

    def step(self, batch: float, drafts: int) -> float:
        """One decoding step over `batch` sequences that drafts `drafts` tokens each."""
        s = self.spec
        extra = max(batch, 1.0) - 1
        return s.step_s * (1 + drafts * s.draft_cost) + extra * s.step_per_seq_s * (1 + drafts * s.verify_cost)

    def tpot(self, batch: float, schedule: Schedule, acceptance: float) -> float:
        """Time per output token of a request at `batch` sequences, for a draft accepted at `acceptance`."""
        drafts = schedule.drafts(max(round(batch), 1))
        return self.step(batch, drafts) / tokens_per_step(acceptance, drafts)
