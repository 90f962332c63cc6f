"""bench/overhead.py's request: a prompt of the length asked for, which the default policy
classifies as its default domain at every length, so a long prompt's run searches every
keyword and pattern (the classifier's dearest case) rather than stopping at a match; and its
table of each round's CPU a request beside the baseline's."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from gateway.policy.loader import load_policy

ROOT = Path(__file__).resolve().parents[3]


def _bench_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def overhead() -> ModuleType:
    return _bench_module("overhead")


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


def test_each_rounds_cpu_is_listed_in_round_order_for_the_targets_that_ran():
    tables = _bench_module("overhead_tables")
    runs = [{"mode": mode, "concurrency": conc, "target": target, "round": rnd, "cpu_us": cpu}
            for mode, conc, target, rnd, cpu in [
                ("stream", 32, "gateway", 1, 402.4), ("stream", 32, "gateway", 0, 399.6),
                ("stream", 32, "baseline", 0, 414.0), ("stream", 32, "baseline", 1, 337.2),
                ("json", 1, "gateway", 0, 452.0), ("json", 1, "baseline", 0, 396.0),
                ("json", 1, "nginx", 0, 73.0)]]
    assert tables.rounds_markdown(runs).splitlines() == [
        "| CPU µs a request, each round | baseline | gateway |", "|---|---|---|",
        "| json, 1 | 396 | 452 |", "| stream, 32 | 414, 337 | 400, 402 |"]
    assert tables.rounds_markdown(runs, ("gateway", "granian")).splitlines()[0] == \
        "| CPU µs a request, each round | gateway |"
