"""A pool's `pacing` section: even out a streamed answer's bursts.

A speculative engine sends the tokens one step accepted in one server-sent
event, so its streams arrive in bursts. With pacing on, the gateway splits
such an event into one event per token and spaces them at the rate the
stream itself shows, holding no byte more than `max_delay_ms` (see
docs/routing.md, "Even streams").
"""

from __future__ import annotations

from pydantic import Field

from gateway.policy.strict import Strict


class PacingSpec(Strict):
    enabled: bool = False
    max_delay_ms: float = Field(default=150.0, gt=0, le=2000)  # the most any byte is held past its arrival
