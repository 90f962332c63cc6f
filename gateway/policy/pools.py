"""A pool in the policy: `PoolSpec`, its endpoints and the sections that say
how the gateway talks to them (timeouts, connections, retries, health
checks, the wait queue).

How a pool picks an endpoint (`balance`, `affinity`), paces its streams,
sheds priorities and drafts (its kind) each have a module of their own in
this package; `PoolSpec` gathers them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway.policy.balance import AffinitySpec, Balance
from gateway.policy.kinds import KINDS, PoolKind, check_schedule
from gateway.policy.pacing import PacingSpec
from gateway.policy.priors import SloSpec
from gateway.policy.shedding import PrioritySpec
from gateway.policy.strict import Strict


class EndpointSpec(Strict):
    url: str
    weight: float = Field(default=1.0, gt=0)
    max_in_flight: int | None = Field(default=None, ge=1)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"endpoint url must start with http:// or https://, got {url!r}")
        return url.rstrip("/")


class TimeoutsSpec(Strict):
    connect_s: float = Field(default=5.0, gt=0)
    first_byte_s: float = Field(default=120.0, gt=0)
    total_s: float = Field(default=600.0, gt=0)
    idle_s: float = Field(default=60.0, gt=0)  # a stream's silence between chunks, after the first


class ConnectionsSpec(Strict):
    max_connections: int = Field(default=512, ge=1)
    max_keepalive: int = Field(default=128, ge=0)
    keepalive_expiry_s: float = Field(default=4.0, gt=0)  # under uvicorn's 5 s server default


class RetrySpec(Strict):
    attempts: int = Field(default=3, ge=1, le=10)  # tries in all, the first included
    budget_ratio: float = Field(default=0.2, ge=0, le=1)  # retries allowed per request sent, over a window


class HealthSpec(Strict):
    path: str = "/health"
    interval_s: float = Field(default=5.0, gt=0)
    eject_after: int = Field(default=3, ge=1)  # consecutive failures
    unhealthy_after: int = Field(default=2, ge=1)  # consecutive failed checks before an endpoint is down
    backoff_s: float = Field(default=2.0, gt=0)
    max_backoff_s: float = Field(default=60.0, gt=0)


class QueueSpec(Strict):
    """Waiting for a slot while the chain is full; unset, see `queue_limits` (upstream/pools.py)."""
    max_waiting: int | None = Field(default=None, ge=0)
    max_wait_s: float | None = Field(default=None, gt=0)


class PoolSpec(Strict):
    balance: Balance | None = None  # unset: prefix for more than one endpoint, else least_outstanding
    affinity: AffinitySpec = AffinitySpec()
    kind: PoolKind  # its row in gateway/policy/kinds.py
    speculation_schedule: list[list[int]] | None = None  # dynamic: [[lo, hi, k], ...] by batch size
    slo: SloSpec = SloSpec()  # the objective admission keeps its running requests within
    endpoints: list[EndpointSpec] = Field(min_length=1)
    model: str | None = None  # upstream model name the client's model is rewritten to
    fallback: str | None = None
    max_in_flight: int | None = Field(default=None, ge=1)  # per endpoint, unless the endpoint says
    max_model_len: int | None = Field(default=None, ge=1)  # context length: bounds a request's max_tokens
    dialect: Literal["vllm", "sglang"] = "vllm"
    api_key: str | None = None  # "os.environ/NAME"
    timeouts: TimeoutsSpec = TimeoutsSpec()
    connections: ConnectionsSpec = ConnectionsSpec()
    retry: RetrySpec = RetrySpec()
    health: HealthSpec = HealthSpec()
    queue: QueueSpec = QueueSpec()
    pacing: PacingSpec = PacingSpec()  # split and space a stream's multi-token events
    priority: PrioritySpec = PrioritySpec()  # shed low priorities while saturated

    @field_validator("api_key")
    @classmethod
    def _env_reference(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"os\.environ/[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError("api_key must reference the environment as os.environ/NAME; "
                             "keys are never written in the policy")
        return value

    @model_validator(mode="after")
    def _schedule(self) -> PoolSpec:
        declares = KINDS[self.kind].declares_schedule
        if declares and not self.speculation_schedule:
            raise ValueError(f"a {self.kind} pool states its speculation_schedule: [[lo, hi, k], ...]")
        if not declares and self.speculation_schedule is not None:
            raise ValueError(f"speculation_schedule goes with kind: dynamic, not {self.kind}")
        problems = check_schedule(self.speculation_schedule or [])
        if problems:
            raise ValueError("speculation_schedule: " + "; ".join(problems))
        return self

    @property
    def api_key_variable(self) -> str | None:
        """The environment variable holding the pool's own key for its backends, if it has one."""
        return None if self.api_key is None else self.api_key.removeprefix("os.environ/")


def fallback_chain(pools: dict[str, PoolSpec], pool: str) -> tuple[str, ...]:
    """`pool`, then its fallback, that one's fallback, ...: each pool once, and
    only pools that exist. The one walk of a chain: `Policy.fallback_chains`
    serves it to routing, the proxy and the guard; the loader checks loops with it."""
    chain = [pool]
    while (fallback := pools[chain[-1]].fallback) in pools and fallback not in chain:
        chain.append(fallback)
    return tuple(chain)
