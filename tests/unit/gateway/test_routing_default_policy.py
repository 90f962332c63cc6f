"""The default policy's decision matrix, as a table of requests and expected pools."""

from __future__ import annotations

import pytest

from gateway.decide.features import extract_features
from gateway.decide.routing import decide
from gateway.flags import FlagStore, Mode
from gateway.policy.loader import load_policy
from gateway.settings import default_policy_path

POLICY = load_policy(default_policy_path())


def chat(**fields):
    return {"model": "smollm2", "messages": [{"role": "user", "content": "Tell me about rivers."}], **fields}


def route(body, load=None, endpoint="chat", flags=None, draw=1.0):
    load = {"speculative": 0, "standard": 0, **(load or {})}
    features = extract_features(body, endpoint, POLICY.defaults, POLICY.classifier, load)
    flags = flags or FlagStore(["speculative"]).snapshot()
    return decide(features, POLICY, flags, draw)


CASES = [
    # (id, body, load, pool, rule): a cold latency model and no random draw, so the priors' means decide
    ("greedy long stream", chat(temperature=0, max_tokens=512, stream=True), {}, "speculative", "default"),
    ("greedy long blocking", chat(temperature=0, max_tokens=512), {}, "speculative", "default"),
    ("omitted temperature is 1.0", chat(max_tokens=512, stream=True), {}, "speculative", "default"),
    ("temperature exactly 1.0", chat(temperature=1.0, max_tokens=512), {}, "speculative", "default"),
    # above temperature 1.0 the priors' acceptance collapses: a cold gateway sends it to standard
    ("hot sampling, cold model", chat(temperature=1.2, max_tokens=512, stream=True), {}, "standard", "default"),
    ("hot code, cold model", {**chat(temperature=1.5, max_tokens=512), "messages": [
        {"role": "user", "content": "Fix this python traceback"}]}, {}, "standard", "default"),
    ("greedy code, cold model", {**chat(temperature=0, max_tokens=512), "messages": [
        {"role": "user", "content": "Fix this python traceback"}]}, {}, "speculative", "default"),
    ("short output, cold model", chat(temperature=0, max_tokens=16, stream=True), {}, "speculative", "default"),
    ("short blocking, cold model", chat(temperature=0, max_tokens=48), {}, "speculative", "default"),
    ("short but streamed", chat(temperature=0, max_tokens=48, stream=True), {}, "speculative", "default"),
    ("omitted max_tokens is 256", chat(temperature=0), {}, "speculative", "default"),
    # the cost to the fleet: a few running sequences are worth slowing for a faster answer ...
    ("speculative at 4 in flight, priors", chat(temperature=0, max_tokens=512, stream=True), {"speculative": 4},
     "speculative", "default"),
    # ... eight are not, while a standard replica stands idle (own E2E alone would still pick speculative)
    ("speculative at 8 in flight, priors", chat(temperature=0, max_tokens=512, stream=True), {"speculative": 8},
     "standard", "default"),
    ("speculative far past the crossover", chat(temperature=0, max_tokens=512, stream=True),
     {"speculative": 100}, "standard", "default"),
    ("standard pool load is irrelevant", chat(temperature=0, max_tokens=512), {"standard": 50},
     "speculative", "default"),
]

@pytest.mark.parametrize("body,load,pool,rule", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_default_policy_routes(body, load, pool, rule):
    decision = route(body, load)
    assert (decision.pool, decision.rule) == (pool, rule)


def test_completions_endpoint_uses_the_same_matrix():
    body = {"model": "m", "prompt": "Once upon a time", "temperature": 0, "max_tokens": 300}
    assert route(body, endpoint="completions").pool == "speculative"
    assert route(body, {"speculative": 100}, endpoint="completions").pool == "standard"


def test_guard_off_sends_speculative_traffic_to_fallback_except_probes():
    store = FlagStore(["speculative"])
    store.set_guard("speculative", False, "low_acceptance")
    body = chat(temperature=0, max_tokens=512, stream=True)
    fallback = route(body, flags=store.snapshot(), draw=0.5)
    probe = route(body, flags=store.snapshot(), draw=0.01)
    assert (fallback.pool, fallback.probe) == ("standard", False)
    assert "low_acceptance" in fallback.reason
    assert (probe.pool, probe.probe) == ("speculative", True)


@pytest.mark.parametrize("mode,draw,pool", [
    (Mode.FORCE_OFF, 0.0, "standard"),     # force_off: not even probes
    (Mode.FORCE_ON, 0.99, "speculative"),  # force_on ignores the guard
])
def test_manual_modes_override_the_guard(mode, draw, pool):
    store = FlagStore(["speculative"])
    store.set_guard("speculative", False, "low_acceptance")
    store.set_mode("speculative", mode)
    assert route(chat(temperature=0, max_tokens=512), flags=store.snapshot(), draw=draw).pool == pool


def test_domain_classification_in_features():
    code = chat(messages=[{"role": "user", "content": "Refactor this:\n```python\ndef f(x):\n  return x\n```"}])
    math = chat(messages=[{"role": "user", "content": "What is \\frac{1}{2} + 3?"}])
    summary = chat(messages=[{"role": "user", "content": "Please summarize the following article."}])
    plain = chat()
    domains = [extract_features(b, "chat", POLICY.defaults, POLICY.classifier, {}).domain
               for b in (code, math, summary, plain)]
    assert domains == ["code", "math", "summarization", "chat"]
