"""Rule-based domain classifier: the first domain whose patterns or keywords
match wins.

It runs on every request, so it is built for speed: each regex is searched on
its own (a pattern that starts with a literal lets the regex engine skip ahead
to it; one big alternation would not), and keywords are plain substring
searches in the lower-cased text, checked for word boundaries only on a hit.
A pattern that opens with a small character class (the default policy's
`[0-9]...`) is searched only where the text holds one of the class's
characters (`opening_class`), once the text is long enough for that to pay
(`OPENING_FROM`): the regex engine tests such a class at every character, 8 ns
each (a 4 KB prompt without a digit took it 32 µs), where the ten substring
tests of the default's digits take 1.4 µs at any length up to a few KB.
Patterns that open with a literal need no such help: the engine skips ahead
to their opening as fast as a substring test would.
The classifier sees only the tail of very long prompts: the domain shows in
what was asked last, and it bounds the cost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_DOMAIN = "chat"
SCAN_CHARS = 8192
OPENING_FROM = 256  # characters of text from which an opening class is looked for before the search


@dataclass(frozen=True)
class DomainRule:
    name: str
    patterns: Sequence[str] = ()
    keywords: Sequence[str] = ()


class _Domain:
    def __init__(self, rule: DomainRule) -> None:
        self.name = rule.name
        openings = [(opening_class(p), re.compile(p)) for p in rule.patterns]
        # which of a domain's patterns matches does not matter, so those with an opening class go last
        self.patterns = [pattern for opening, pattern in openings if not opening]
        self.classed = [(opening, pattern) for opening, pattern in openings if opening]
        self.keywords = tuple(k.lower() for k in rule.keywords if k)


class DomainClassifier:
    def __init__(self, rules: Iterable[DomainRule], default: str = DEFAULT_DOMAIN) -> None:
        self.default = default
        self._domains = [_Domain(rule) for rule in rules]
        self._needs_lower = any(d.keywords for d in self._domains)

    def __call__(self, text: str) -> str:
        tail = text[-SCAN_CHARS:]
        lower = tail.lower() if self._needs_lower else tail
        long = len(tail) >= OPENING_FROM
        # plain loops in one frame, and `in` before the boundary check: on a short prompt the calls
        # are most of the cost (a call per domain was three of a request's interpreted frames), and
        # most keywords do not occur at all
        for domain in self._domains:
            for pattern in domain.patterns:
                if pattern.search(tail):
                    return domain.name
            for opening, pattern in domain.classed:
                if (not long or any(map(tail.__contains__, opening))) and pattern.search(tail):
                    return domain.name
            for keyword in domain.keywords:
                if keyword in lower and _has_word(lower, keyword):
                    return domain.name
        return self.default


MAX_OPENING = 16


def opening_class(source: str) -> str:
    """The characters one of which every match of the regex `source` opens with, where it
    opens with a character class of at most `MAX_OPENING` plain ASCII characters or ranges
    (`[0-9]`, `[-+*/]`) met at least once; '' where not known so (anything else, a negated
    class, an escape in it, a `|` anywhere, a class that may be skipped: `*`, `?`, `{`)."""
    if not source.startswith("[") or "|" in source:
        return ""
    close = source.find("]", 1)
    if close < 0:
        return ""
    body, after = source[1:close], source[close + 1:close + 2]
    if not body or body[0] == "^" or "\\" in body or "[" in body or after in ("*", "?", "{"):
        return ""
    chars: set[str] = set()
    at = 0
    while at < len(body):
        if at + 2 < len(body) and body[at + 1] == "-":  # a range; a `-` first or last is itself
            low, high = ord(body[at]), ord(body[at + 2])
            if not 0 <= high - low < MAX_OPENING:  # reversed, or too wide to list (`[a-\U0010ffff]`)
                return ""
            chars.update(chr(code) for code in range(low, high + 1))
            at += 3
        else:
            chars.add(body[at])
            at += 1
        if len(chars) > MAX_OPENING:
            return ""
    return "".join(sorted(chars)) if all(char.isascii() for char in chars) else ""


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
