"""A recorded latency baseline: what the pool did before speculation changed anything.

`specgate baseline record` writes it; the guard reads it (policy
`guard.baseline_file`) to judge latency regressions against fixed numbers
instead of the standard pool's live ones. The format is fixed::

    {"url": "http://...", "model": "...", "recorded_at": "2026-01-01T00:00:00+00:00",
     "requests": 200,
     "ttft_s": {"p50": 0.05, "p95": 0.09},
     "tpot_s": {"p50": 0.012, "p95": 0.02},
     "e2e_s": {"p50": 1.1, "p95": 2.3}}
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Percentiles(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    p50: float = Field(ge=0)
    p95: float = Field(ge=0)


class Baseline(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    model: str
    recorded_at: datetime
    requests: int = Field(ge=0)
    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles

    def p95(self, metric: str) -> float:
        """The recorded p95 for a guard latency metric (itl, tpot or e2e)."""
        return {"itl": self.tpot_s, "tpot": self.tpot_s, "e2e": self.e2e_s}[metric].p95

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


class BaselineError(ValueError):
    pass


def read_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Parse a baseline file; a missing or malformed file raises `BaselineError`."""
    try:
        return Baseline.model_validate_json(Path(path).read_bytes())
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read baseline: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<top>'}: {e['msg']}" for e in exc.errors())
        raise BaselineError(f"{path}: not a baseline file: {problems}") from None


def write_baseline(path: str | os.PathLike[str], baseline: Baseline) -> None:
    """Write atomically (temporary file, then rename)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_text(baseline.to_json() + "\n", encoding="utf-8")
    os.replace(temporary, target)
