"""The domain classifier searches a pattern that opens with a small character class only where
the text holds one of its characters (`opening_class`): that must never change a domain."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domains.classifier import OPENING_FROM, DomainClassifier, DomainRule, opening_class
from gateway.policy.loader import load_policy

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("source", "opening"), [
    ("[0-9]\\s*[-+*/^]\\s*[0-9]+\\s*=", "0123456789"),
    ("[ab]+c", "ab"),
    ("[-+]x", "+-"),
    ("[a-]", "-a"),
    ("[-a-c]", "-abc"),
    ("[.]", "."),
    ("[ab]*c", ""),  # may open with the c
    ("[ab]?", ""),
    ("[ab]{2}", ""),  # any braces read as none
    ("[^a]", ""),
    ("[a-z]", ""),  # more than sixteen characters
    ("[a\\]]", ""),
    ("[]a]", ""),
    ("[ab", ""),
    ("[z-a]", ""),
    ("[a-\U0010ffff]", ""),  # read without listing a million characters
    ("[0-9a-g]", ""),  # ranges that add up past sixteen
    ("[é]", ""),
    ("[a]|b", ""),
    ("abc", ""),  # a literal opening: the engine skips ahead to it itself
    ("", ""),
])
def test_the_opening_class(source: str, opening: str) -> None:
    assert opening_class(source) == opening


# Patterns of plain characters, classes, escapes, groups, alternatives and quantifiers.
TOKENS = ["a", "b", "1", "-", ".", "\\.", "\\d", "[ab]", "[0-9]", "[a-c]", "[-b]", "[^a]", "[.a]", "(", ")",
          "(?:", "|", "*", "+", "?", "{2}", "{0,1}", "^", "$"]
TEXT = st.text(alphabet="abc1-.x ", max_size=24)


@st.composite
def patterns(draw: st.DrawFn) -> str:
    source = "".join(draw(st.lists(st.sampled_from(TOKENS), max_size=8)))
    try:
        re.compile(source)
    except re.error:
        return "[ab]"
    return source


@settings(max_examples=2000, deadline=None)
@given(patterns(), TEXT)
def test_every_match_opens_with_a_character_of_the_class(source: str, text: str) -> None:
    opening, pattern = opening_class(source), re.compile(source)
    if not opening:
        return
    for start in range(len(text) + 1):
        if pattern.match(text, start) is not None:
            assert text[start:start + 1] in set(opening), (source, text, start)


@settings(max_examples=500, deadline=None)
@given(st.lists(patterns(), min_size=1, max_size=4), st.lists(patterns(), max_size=4), TEXT,
       st.sampled_from(["", " x" * (OPENING_FROM // 2)]))
def test_a_domain_is_the_one_every_search_finds(first: list[str], second: list[str], tail: str, pad: str) -> None:
    """On short texts, and on texts long enough that an opening class is looked for first."""
    text = pad + tail
    rules = [DomainRule("one", patterns=first), DomainRule("two", patterns=second)]
    expected = next((rule.name for rule in rules if any(re.search(p, text) for p in rule.patterns)), "chat")
    assert DomainClassifier(rules)(text) == expected


def test_the_default_policys_math_pattern_waits_for_a_digit() -> None:
    """The default policy's one pattern that opens with a class is the one this is for."""
    patterns = [p for d in load_policy(ROOT / "policies" / "default.yaml").spec.domains.values() for p in d.patterns]
    assert [opening_class(p) for p in patterns if p.startswith("[")] == ["0123456789"]
