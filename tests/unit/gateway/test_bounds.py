"""Upper bounds on the request fields that multiply a backend's work."""

from __future__ import annotations

import pytest

from gateway.decide.features import Limits, check_limits
from gateway.errors import InvalidRequest
from gateway.policy.loader import parse_policy

LIMITS = Limits(n=16, max_tokens=4096)


@pytest.mark.parametrize("body", [
    {},
    {"n": 16, "best_of": 16, "max_tokens": 4096, "max_completion_tokens": 4096},
    {"n": 1, "max_tokens": 1},
])
def test_within_the_limits(body):
    check_limits(body, LIMITS)


@pytest.mark.parametrize("body,param", [
    ({"n": 17}, "n"),
    ({"n": 100_000}, "n"),
    ({"best_of": 17}, "best_of"),
    ({"best_of": "many"}, "best_of"),
    ({"best_of": 0}, "best_of"),
    ({"max_tokens": 4097}, "max_tokens"),
    ({"max_completion_tokens": 10**12}, "max_completion_tokens"),
    ({"max_completion_tokens": 10, "max_tokens": 5000}, "max_tokens"),  # both are read by some backend
    ({"n": True}, "n"),
])
def test_over_a_limit_or_of_the_wrong_type_is_a_400_naming_the_field(body, param):
    with pytest.raises(InvalidRequest) as info:
        check_limits(body, LIMITS)
    assert info.value.param == param


def test_a_pool_may_give_its_context_length():
    spec = parse_policy("version: 1\npools:\n  a: {kind: standard, endpoints: [{url: 'http://127.0.0.1:1'}], "
                        "max_model_len: 2048}\nrules: [{name: all, route: a}]\n")
    assert spec.pools["a"].max_model_len == 2048
