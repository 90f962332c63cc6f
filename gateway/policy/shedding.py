"""A pool's `priority` section: which priorities it sheds while saturated
(the priorities themselves are priority.py's; docs/priorities.md)."""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.policy.priority import HIGHEST, LOWEST
from gateway.policy.strict import Strict


class PrioritySpec(Strict):
    """When the pool is saturated (at its in-flight limit, or its load, the
    backends' running + waiting as routing reads it, at `busy_load` or
    more), requests of priority below `shed_below` are answered 429 at once
    instead of waiting. Unset: every request may wait in the queue."""

    shed_below: int | None = Field(default=None, ge=LOWEST, le=HIGHEST)
    busy_load: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _threshold_for_busy(self) -> PrioritySpec:
        if self.busy_load is not None and self.shed_below is None:
            raise ValueError("busy_load needs shed_below: the priorities to shed while the pool is busy")
        return self
