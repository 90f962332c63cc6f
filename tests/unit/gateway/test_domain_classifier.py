"""The domain classifier searches a regex only where the text holds the characters its every
match begins with (`leading_literal`): that must never change a domain."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domains.classifier import DomainClassifier, DomainRule, leading_literal
from gateway.policy.loader import load_policy

ROOT = Path(__file__).resolve().parents[3]
POLICY_PATTERNS = [pattern for domain in load_policy(ROOT / "policies" / "default.yaml").spec.domains.values()
                   for pattern in domain.patterns]


@pytest.mark.parametrize(("source", "literal"), [
    ("```", "```"),
    ("def\\s+\\w+\\(", "def"),
    ("#include\\s*<", "#include"),
    ("=>\\s*\\{", "=>"),
    ("\\\\frac", "\\frac"),
    ("x\\.y?", "x."),
    ("ab*", "a"),
    ("ab+c", "a"),
    ("ab{2}", "a"),
    ("ab?", "a"),
    ("a|b", ""),
    ("abc\\|d", ""),  # any `|`, escaped or not, reads as none
    ("[0-9]\\s*=", ""),
    ("(?i)abc", ""),
    ("(ab)c", ""),
    ("\\bword", ""),
    ("a\\d", "a"),
    ("", ""),
])
def test_the_leading_literal(source: str, literal: str) -> None:
    assert leading_literal(source) == literal


# Patterns of plain characters, escapes, classes, groups, alternatives and quantifiers.
TOKENS = ["a", "b", ".", "\\.", "\\\\", "\\d", "\\s", "\\b", "[ab]", "(", ")", "(?:", "|", "*", "+", "?",
          "{2}", "{1,2}", "*?", "^", "$", "\\(", "x", " "]
TEXT = st.text(alphabet="ab.\\(x 1", max_size=24)


@st.composite
def patterns(draw: st.DrawFn) -> str:
    source = "".join(draw(st.lists(st.sampled_from(TOKENS), max_size=8)))
    try:
        re.compile(source)
    except re.error:
        return "a"
    return source


@settings(max_examples=2000, deadline=None)
@given(patterns(), TEXT)
def test_every_match_begins_with_the_leading_literal(source: str, text: str) -> None:
    literal, pattern = leading_literal(source), re.compile(source)
    for start in range(len(text) + 1):
        if pattern.match(text, start) is not None:
            assert text.startswith(literal, start), (source, text, start)


@settings(max_examples=500, deadline=None)
@given(st.lists(patterns(), min_size=1, max_size=4), st.lists(patterns(), max_size=4), TEXT)
def test_a_domain_is_the_one_every_search_finds(first: list[str], second: list[str], text: str) -> None:
    rules = [DomainRule("one", patterns=first), DomainRule("two", patterns=second)]
    expected = next((rule.name for rule in rules if any(re.search(p, text) for p in rule.patterns)), "chat")
    assert DomainClassifier(rules)(text) == expected


@pytest.mark.parametrize("source", POLICY_PATTERNS)
def test_the_default_policys_patterns_open_with_a_literal(source: str) -> None:
    """All but a pattern that opens with a character class are searched only behind their opening."""
    assert source.startswith("[") or leading_literal(source), source
