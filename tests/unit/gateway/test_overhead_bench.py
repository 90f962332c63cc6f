"""bench/overhead.py's request: a prompt of the length asked for, which the default policy
classifies as its default domain at every length, so a long prompt's run searches every
keyword and pattern (the classifier's dearest case) rather than stopping at a match."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from gateway.policy.loader import load_policy

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def overhead() -> ModuleType:
    spec = importlib.util.spec_from_file_location("overhead", ROOT / "bench" / "overhead.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_default_length_is_the_benchs_one_sentence(overhead):
    assert overhead.body(len(overhead.PROMPT)) == overhead.BODY


@pytest.mark.parametrize("chars", [1, 26, 28, 255, 256, 4096, 65536])
def test_a_prompt_of_every_length_asked_for_in_the_default_domain(overhead, chars):
    policy = load_policy(ROOT / "policies" / "default.yaml")
    request = overhead.body(chars)
    text = request["messages"][0]["content"]
    assert len(text) == chars
    rest = {k: v for k, v in request.items() if k != "messages"}
    assert rest == {k: v for k, v in overhead.BODY.items() if k != "messages"}
    assert policy.classifier(text) == policy.spec.default_domain
