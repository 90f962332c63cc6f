"""Rule-based domain classifier: the first domain whose patterns match wins.

Each domain's regexes and keywords are compiled into one alternation, so a
prompt is scanned once per domain. Keywords match case-insensitively as whole
words. The classifier sees only the tail of very long prompts: the domain of
a request shows in what was asked last, and it bounds the cost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_DOMAIN = "chat"
SCAN_CHARS = 8192


@dataclass(frozen=True)
class DomainRule:
    name: str
    patterns: Sequence[str] = ()
    keywords: Sequence[str] = ()


class DomainClassifier:
    def __init__(self, rules: Iterable[DomainRule], default: str = DEFAULT_DOMAIN) -> None:
        self.default = default
        self._compiled = [(rule.name, _compile(rule)) for rule in rules]

    def __call__(self, text: str) -> str:
        tail = text[-SCAN_CHARS:]
        for name, pattern in self._compiled:
            if pattern is not None and pattern.search(tail):
                return name
        return self.default


def _compile(rule: DomainRule) -> re.Pattern[str] | None:
    parts = [f"(?:{p})" for p in rule.patterns]
    if rule.keywords:
        words = "|".join(re.escape(k) for k in rule.keywords)
        parts.append(f"(?i:\\b(?:{words})\\b)")
    return re.compile("|".join(parts)) if parts else None
