"""A pool's `balance` and `affinity` sections: how it picks an endpoint.

`balance: prefix` sends a request to the endpoint that served the longest
leading part of its prompt (its KV cache likely still holds it), or that
holds its session, unless that endpoint's load is over the bound
`load_factor` sets; `balance: least_outstanding` is the less loaded of two
endpoints drawn by weight. Unset, a pool of more than one endpoint balances
by prefix (see docs/affinity.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.policy.strict import Strict

Balance = Literal["prefix", "least_outstanding"]
SESSION_HEADER = "x-specgate-session"


class AffinitySpec(Strict):
    # an endpoint takes a request while its load after it is at most
    # ceil(load_factor x the mean load of the pool's available endpoints after it), by weight
    load_factor: float = Field(default=1.25, ge=1.0, le=100.0)
    block_chars: int = Field(default=256, ge=16, le=1 << 20)  # prompt text is hashed in blocks of this many characters
    max_blocks: int = Field(default=65536, ge=1, le=1 << 24)  # the prefix map's LRU bound (and the sessions')
    session_header: str = Field(default=SESSION_HEADER, min_length=1, max_length=128,
                                pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


def balance_of(balance: Balance | None, endpoints: int) -> Balance:
    """The balance a pool of `endpoints` endpoints uses."""
    if balance is not None:
        return balance
    return "prefix" if endpoints > 1 else "least_outstanding"
