"""The `when:` language and request parsing into Features."""

from __future__ import annotations

import inspect

import pytest

from gateway.decide.features import extract_features, parse_json_body
from gateway.errors import InvalidRequest
from gateway.policy.conditions import ConditionError, compile_condition
from gateway.policy.features import FEATURE_NAMES, Defaults, Features

POOLS = ("speculative", "standard")


def features(**body):
    body.setdefault("messages", [{"role": "user", "content": "hello"}])
    return extract_features(body, "chat", Defaults(), lambda text: "chat", {"speculative": 3})


@pytest.mark.parametrize("when,body,expected", [
    ({"temperature": {"gt": 1.0}}, {"temperature": 1.5}, True),
    ({"temperature": {"gt": 1.0}}, {}, False),  # omitted = default 1.0
    ({"stream": False, "max_tokens": {"lt": 64}}, {"max_tokens": 10}, True),
    ({"stream": False, "max_tokens": {"lt": 64}}, {"max_tokens": 10, "stream": True}, False),
    ({"domain": {"in": ["chat", "math"]}}, {}, True),
    ({"domain": {"not_in": ["chat"]}}, {}, False),
    ({"model": {"matches": "^llama-"}}, {"model": "llama-3"}, True),
    ({"model": {"matches": "^llama-"}}, {}, False),  # missing value never matches
    ({"any": [{"n": {"gt": 1}}, {"tools": True}]}, {"tools": [{"type": "function"}]}, True),
    ({"all": [{"n": 1}, {"logprobs": True}]}, {"logprobs": True}, True),
    ({"not": {"load.speculative": {"ge": 3}}}, {}, False),
    ({"load.standard": {"eq": 0}}, {}, True),
    ({"temperature": {"ge": 0, "le": 0.5}}, {"temperature": 0.2}, True),
    ({"response_format": True}, {"response_format": {"type": "json_object"}}, True),
    ({"response_format": True}, {"response_format": {"type": "text"}}, False),
])
def test_conditions(when, body, expected):
    assert compile_condition(when, POOLS)(features(**body)) is expected


@pytest.mark.parametrize("when,path", [
    ({}, ()),
    ({"any": []}, ("any",)),
    ({"all": [{"bogus": 1}]}, ("all", 0, "bogus")),
    ({"max_tokens": {"lt": "ten"}}, ("max_tokens", "lt")),
    ({"domain": {"in": "code"}}, ("domain", "in")),
])
def test_condition_errors_carry_their_path(when, path):
    with pytest.raises(ConditionError) as info:
        compile_condition(when, POOLS)
    assert info.value.path == path


def test_feature_extraction():
    f = features(temperature=0, max_completion_tokens=40, stream=True, n=2, top_p=0.9,
                 messages=[{"role": "system", "content": "x" * 40},
                           {"role": "user", "content": [{"type": "text", "text": "y" * 40}]}])
    assert (f.temperature, f.max_tokens, f.stream, f.n, f.top_p) == (0.0, 40, True, 2, 0.9)
    assert f.prompt_chars == 81 and f.prompt_tokens == 21
    assert f.load == {"speculative": 3}


def test_token_id_prompts_count_tokens():
    f = extract_features({"prompt": [1, 2, 3, 4]}, "completions", Defaults(), lambda t: "chat", {})
    assert f.prompt_tokens == 4


@pytest.mark.parametrize("body,param", [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"n": 0}, "n"),
    ({"model": 5}, "model"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [3]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
])
def test_wrong_types_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as info:
        features(**body)
    assert info.value.param == param


@pytest.mark.parametrize("raw,fragment", [
    (b"{", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"temperature": NaN}', "NaN"),
    (b'{"a": Infinity}', "Infinity"),
    (b"\xff\xfe", "not valid"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
])
def test_bad_bodies(raw, fragment):
    with pytest.raises(InvalidRequest) as info:
        parse_json_body(raw)
    assert fragment in info.value.message


def test_the_names_a_rule_may_read_are_the_features_fields_but_load():
    """`FEATURE_NAMES` is written out beside the class: it must name every field, in order."""
    fields = list(inspect.signature(Features).parameters)
    assert [*FEATURE_NAMES, "load"] == fields
    one = features(temperature=0.3)
    assert one.to_json() == {**{name: getattr(one, name) for name in FEATURE_NAMES}, "load": {"speculative": 3}}
    assert one == features(temperature=0.3) != features(temperature=0.4)
