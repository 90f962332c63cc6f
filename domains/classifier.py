"""Rule-based domain classifier: the first domain whose patterns or keywords
match wins.

It runs on every request, so it is built for speed: each regex is searched on
its own (a pattern that starts with a literal lets the regex engine skip ahead
to it; one big alternation would not), and keywords are plain substring
searches in the lower-cased text, checked for word boundaries only on a hit.
The classifier sees only the tail of very long prompts: the domain shows in
what was asked last, and it bounds the cost.
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


class _Domain:
    def __init__(self, rule: DomainRule) -> None:
        self.name = rule.name
        self.patterns = [re.compile(p) for p in rule.patterns]
        self.keywords = tuple(k.lower() for k in rule.keywords if k)


class DomainClassifier:
    def __init__(self, rules: Iterable[DomainRule], default: str = DEFAULT_DOMAIN) -> None:
        self.default = default
        self._domains = [_Domain(rule) for rule in rules]
        self._needs_lower = any(d.keywords for d in self._domains)

    def __call__(self, text: str) -> str:
        tail = text[-SCAN_CHARS:]
        lower = tail.lower() if self._needs_lower else tail
        # plain loops in one frame, and `in` before the boundary check: on a short prompt the calls
        # are most of the cost (a call per domain was three of a request's interpreted frames), and
        # most keywords do not occur at all
        for domain in self._domains:
            for pattern in domain.patterns:
                if pattern.search(tail):
                    return domain.name
            for keyword in domain.keywords:
                if keyword in lower and _has_word(lower, keyword):
                    return domain.name
        return self.default


def _has_word(text: str, word: str) -> bool:
    """`word` occurs in `text` with no letter, digit or underscore glued to either end."""
    start = text.find(word)
    while start >= 0:
        end = start + len(word)
        before_ok = start == 0 or not _word_char(text[start - 1]) or not _word_char(word[0])
        after_ok = end == len(text) or not _word_char(text[end]) or not _word_char(word[-1])
        if before_ok and after_ok:
            return True
        start = text.find(word, start + 1)
    return False


def _word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"
