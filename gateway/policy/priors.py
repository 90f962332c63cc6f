"""`routing.priors` and a pool's `slo`: what the gateway assumes before it has measured.

Acceptance is the draft's per-token acceptance rate `a`, per domain and
temperature band. With `a` and `k` drafted tokens a verification step yields
`(1 - a^(k+1)) / (1 - a)` tokens (Leviathan et al. 2023, eq. 1), and a drafting
step costs `1 + k * draft_cost` plain steps at batch 1; every sequence in the
batch also pays for its `k` extra verified tokens at `verify_cost` of a plain
token each. The defaults follow the speculative-decoding playbook's matrix:
temperature 0 accepts most, code and maths above chat, and above temperature
1.0 acceptance collapses, so a cold gateway sends hot sampling to a standard
pool and greedy code to speculation (docs/routing.md has the table).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from gateway.policy.classes import BANDS
from gateway.policy.kinds import MAX_DRAFT_TOKENS
from gateway.policy.strict import Strict

PLAYBOOK_ACCEPTANCE: dict[str, dict[str, float]] = {
    "code": {"greedy": 0.85, "low": 0.78, "mid": 0.62, "hot": 0.2},
    "math": {"greedy": 0.8, "low": 0.72, "mid": 0.58, "hot": 0.18},
    "chat": {"greedy": 0.72, "low": 0.64, "mid": 0.5, "hot": 0.15},
}


class PriorsSpec(Strict):
    """The latency model's cold curves. Step times are a GPU's (the pool simulator's
    8B target on one A100, docs/sim.md); the learned estimates replace them within a
    few answers, and pools that answered rescale the priors of those that have not."""

    acceptance: dict[str, dict[str, float]] = Field(default_factory=lambda: PLAYBOOK_ACCEPTANCE)
    draft_tokens: int = Field(default=3, ge=1, le=MAX_DRAFT_TOKENS)  # k of a speculative pool
    draft_cost: float = Field(default=0.1, ge=0)  # one drafted token, in plain steps at batch 1
    verify_cost: float = Field(default=0.8, ge=0)  # one extra verified token per sequence, in plain tokens
    ttft_s: float = Field(default=0.06, gt=0)  # first token with nothing else running
    ttft_per_seq_s: float = Field(default=0.0003, ge=0)  # ... growing by this per running sequence
    step_s: float = Field(default=0.0103, gt=0)  # a plain decoding step at batch 1
    step_per_seq_s: float = Field(default=0.0003, ge=0)  # ... growing by this per sequence
    relative_stddev: float = Field(default=0.5, ge=0)  # how far off a prior may be (cold draws' spread)
    weight: float = Field(default=1.0, gt=0)  # samples an anchor counts for against a bucket's own

    @field_validator("acceptance")
    @classmethod
    def _bands(cls, table: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for domain, bands in table.items():
            unknown = set(bands) - set(BANDS)
            if unknown:
                raise ValueError(f"acceptance.{domain}: unknown band(s) {sorted(unknown)} (bands: {', '.join(BANDS)})")
            bad = {band: a for band, a in bands.items() if not 0.0 <= a < 1.0}
            if bad:
                raise ValueError(f"acceptance.{domain}: a rate is in [0, 1), got {bad}")
        return table

    def acceptance_of(self, domain: str, band: str) -> float:
        """The prior rate of a class; a domain or band the table lacks reads chat's, then the nearest cooler band."""
        bands = self.acceptance.get(domain) or self.acceptance.get("chat") or PLAYBOOK_ACCEPTANCE["chat"]
        for name in BANDS[BANDS.index(band) if band in BANDS else 0::-1]:
            if name in bands:
                return bands[name]
        return PLAYBOOK_ACCEPTANCE["chat"].get(band, 0.5)


class SloSpec(Strict):
    """A pool's objective for the requests it runs: admission keeps its batch where they meet it."""

    ttft_s: float | None = Field(default=None, gt=0)
    tpot_s: float | None = Field(default=None, gt=0)

    @property
    def stated(self) -> bool:
        """Whether it states an objective: an empty `slo`, every pool's default, holds nothing."""
        return self.ttft_s is not None or self.tpot_s is not None
