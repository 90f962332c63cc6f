"""The policy's `guard` section: when speculation goes off and comes back (docs/guard.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.policy.strict import Strict


class AcceptRateSpec(Strict):
    trip_below: float = Field(default=0.4, ge=0, le=1)
    recover_above: float = Field(default=0.55, ge=0, le=1)


class SpeculativeGuardSpec(Strict):
    accept_rate: AcceptRateSpec = AcceptRateSpec()
    latency_regression_pct: float = Field(default=20.0, ge=0)
    trip_after: int = Field(default=3, ge=1)
    recover_after: int = Field(default=5, ge=1)
    min_hold_s: float = Field(default=60.0, ge=0)
    min_draft_tokens: int = Field(default=200, ge=0)
    probe_fraction: float = Field(default=0.05, ge=0, le=1)


class TargetSpec(Strict):
    """How PromQL selects a pool's series: `label` matches `value`, where
    `{endpoints}` stands for the pool's endpoints as host:port and `{pool}`
    for its name (e.g. label: pool, value: "{pool}" behind relabeling)."""
    label: str = Field(default="instance", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    value: str = "{endpoints}"


class ClassGuardSpec(Strict):
    """Per traffic class (domain x temperature bucket): speculation goes off
    for a class whose gateway-measured time per output token on the
    speculative pool is `slower_pct` above the standard pool's."""
    enabled: bool = False
    min_samples: int = Field(default=20, ge=1)  # streamed answers per pool in the window
    slower_pct: float = Field(default=10.0, ge=0)


GuardQuery = Literal["accept_rate", "mean_accepted_length", "draft_tokens", "itl_p95", "e2e_p95",
                     "tpot_p95", "running", "waiting"]


class GuardSpec(Strict):
    enabled: bool = True
    source: Literal["prometheus", "scrape"] = "scrape"
    interval_s: float = Field(default=15.0, gt=0)
    window: str = Field(default="5m", pattern=r"^[0-9]+[smh]$")
    speculative: SpeculativeGuardSpec = SpeculativeGuardSpec()
    stale_after_s: float | None = Field(default=None, gt=0)  # unreadable this long: fall back (off: never)
    baseline_file: str | None = None  # `specgate baseline record` output; else the standard pool
    # tpot: each answer's time per output token. vLLM's itl is one sample per engine step, and a
    # drafting step is longer and yields several tokens, so itl reads a paying draft as a regression
    latency_metric: Literal["itl", "e2e", "tpot"] = "tpot"
    queries: dict[GuardQuery, str] = {}  # PromQL overrides; $selector, $window, $pool expand
    target: TargetSpec = TargetSpec()
    classes: ClassGuardSpec = ClassGuardSpec()

    @property
    def window_s(self) -> float:
        return float(self.window[:-1]) * {"s": 1, "m": 60, "h": 3600}[self.window[-1]]

    @model_validator(mode="after")
    def _consistent(self) -> GuardSpec:
        if self.queries and self.source != "prometheus":
            raise ValueError("guard.queries are PromQL: they need source: prometheus")
        if self.source == "scrape" and self.window_s < 2 * self.interval_s:
            raise ValueError(f"window {self.window} holds fewer than two scrapes {self.interval_s:g} s apart: "
                             "the scrape source needs window >= 2 x interval_s")
        return self
