"""Request priorities: their range, the tiers metrics use, and the rules
that give a request its priority (docs/priorities.md); a pool's `priority`
section, what it sheds, is shedding.py's. Plain functions, compiled with the
request path.

A priority is an integer from -1000 to 1000, higher goes first, 0 by
default. Where it comes from, later ones winning:

1. the client key's `priority` (0 without keys);
2. the first matching rule's `priority:`, when it sets one;
3. the `x-specgate-priority` header, which may lower the priority freely but
   raise it only up to the key's `max_priority` (default: the key's
   `priority`; 0 without keys).
"""

from __future__ import annotations

import re

from gateway.errors import InvalidRequest

LOWEST, HIGHEST = -1000, 1000
HEADER = "x-specgate-priority"
TIERS = ("low", "normal", "high")  # the metrics' label values: < 0, 0, > 0
_INTEGER = re.compile(r"[+-]?[0-9]{1,5}")


def tier(priority: int) -> str:
    """The bounded label a priority is counted under."""
    return "low" if priority < 0 else "high" if priority > 0 else "normal"


def claimed(value: str | None) -> int | None:
    """The priority the `x-specgate-priority` header claims; 400 when it is not an integer in range."""
    if value is None:
        return None
    text = value.strip()
    if not _INTEGER.fullmatch(text) or not LOWEST <= int(text) <= HIGHEST:
        raise InvalidRequest(f"header '{HEADER}' must be an integer from {LOWEST} to {HIGHEST}, got {value!r}",
                             param=HEADER)
    return int(text)


def resolve(key_priority: int, key_max: int, rule_priority: int | None, header: int | None) -> int:
    """A request's priority from its sources (see the module's docstring)."""
    priority = key_priority if rule_priority is None else rule_priority
    if header is None:
        return priority
    return header if header <= priority else min(header, max(priority, key_max))
