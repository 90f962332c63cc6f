"""A request's priority at the edge: its key's, its rule's, or the one its
`x-specgate-priority` header claims within the key's cap (the order is in
gateway/policy/priority.py and docs/priorities.md)."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.edge.auth import Grant
from gateway.policy.compiled import Policy
from gateway.policy.priority import HEADER, claimed, resolve


def request_priority(headers: Mapping[str, str], grant: Grant | None, policy: Policy, rule: str | None) -> int:
    """400 when the header is not an integer from -1000 to 1000."""
    header = claimed(headers.get(HEADER))
    own, cap = (0, 0) if grant is None else (grant.priority, grant.cap)
    return resolve(own, cap, None if rule is None else policy.rule_priorities.get(rule), header)
