"""The latency model's cold start: curves of TTFT and TPOT against load per kind of pool."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LatencyPriors:
    """Cold-start curves, used before a (pool, class) has answered anything.

    The defaults are the pool simulator's GPU model (docs/sim.md: an 8B target
    on one A100, an EAGLE-style draft of 3 tokens; step time W + p*C + b*(K + C)
    with W = 10 ms, C = 0.25 ms, K = 0.05 ms) and the speed-ups measured in
    docs/benchmarks.md. CPU backends are several times slower per token
    (`specgate tune`: ~58 ms), so a deployment there sets its own; the learned
    estimates replace the priors within a few samples either way.
    """
    # First token with nothing else running: W plus a 200-token prefill at C per token.
    ttft_s: float = 0.06
    # The admitting step grows by K + C per running sequence.
    ttft_per_seq_s: float = 0.0003
    # Standard pool, one sequence: the simulated step at b = 1 (10.3 ms) ...
    standard_tpot_s: float = 0.0103
    # ... growing by K + C per sequence (86.8 ms at b = 256).
    standard_tpot_per_seq_s: float = 0.0003
    # Speculative TPOT at one sequence = standard / this. Simulator at b = 1:
    # 1.43-2.54x (2.18x chat at T=0); bundled engine: 1.65-3.48x; vLLM: up to 2.8x.
    speculative_speedup: float = 2.0
    # Where speculative TPOT reaches standard's (linear in between and beyond):
    # simulator, chat at T=0, b = 64 (1.00x); the routing replay did best with busy at 64.
    crossover_load: int = 64
    # How far off a prior may be, as a fraction of it (the spread of cold Thompson draws).
    relative_stddev: float = 0.5
    # How many samples an anchor (prior, or neighbours' data) counts for against a bucket's own.
    weight: float = 1.0

    def __post_init__(self) -> None:
        times = (self.ttft_s, self.standard_tpot_s, self.speculative_speedup, self.weight)
        if min(times) <= 0 or min(self.ttft_per_seq_s, self.standard_tpot_per_seq_s, self.relative_stddev) < 0 \
                or self.crossover_load < 1:
            raise ValueError("priors: times, speed-up and weight must be positive, the rest not negative, "
                             "crossover_load at least 1")

    def ttft(self, load: float) -> float:
        return self.ttft_s + load * self.ttft_per_seq_s

    def tpot(self, batch: float, speculative: bool) -> float:
        batch = max(batch, 1.0)
        standard = self.standard_tpot_s + (batch - 1) * self.standard_tpot_per_seq_s
        if not speculative:
            return standard
        alone = self.standard_tpot_s / self.speculative_speedup
        at_crossover = self.standard_tpot_s + (self.crossover_load - 1) * self.standard_tpot_per_seq_s
        return alone + (batch - 1) * (at_crossover - alone) / max(self.crossover_load - 1, 1)
