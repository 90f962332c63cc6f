"""The `when:` language of policy rules, compiled once into predicates.

    when: {temperature: {gt: 1.0}}                 # one feature, one operator
    when: {stream: false, max_tokens: {lt: 64}}    # several keys: all must hold
    when: {domain: {in: [code, math]}}             # a bare value means eq
    when: {any: [{...}, {...}]}                    # combinators: all, any, not
    when: {not: {load.speculative: {ge: 8}}}

A feature is a field of `Features` or `load.<pool>`. Compilation checks
names, operators and operand types and reports the path of the mistake;
evaluation never raises (a comparison with a missing value is false).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.policy.features import FEATURE_NAMES, Features

Predicate = Callable[[Features], bool]

_ORDERED = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}
OPERATORS = ("eq", "ne", *_ORDERED, "in", "not_in", "matches")
COMBINATORS = ("all", "any", "not")


@dataclass
class ConditionError(ValueError):
    path: tuple[Any, ...]
    message: str

    def __str__(self) -> str:
        return self.message


def compile_condition(raw: Any, pools: Collection[str], path: tuple[Any, ...] = ()) -> Predicate:
    if not isinstance(raw, Mapping) or not raw:
        raise ConditionError(path, "a condition must be a non-empty mapping")
    parts = [_compile_key(key, value, pools, (*path, key)) for key, value in raw.items()]
    if len(parts) == 1:
        return parts[0]
    return lambda features: all(part(features) for part in parts)


def _compile_key(key: Any, value: Any, pools: Collection[str], path: tuple[Any, ...]) -> Predicate:
    if key in ("all", "any"):
        if not isinstance(value, list) or not value:
            raise ConditionError(path, f"'{key}' takes a non-empty list of conditions")
        parts = [compile_condition(item, pools, (*path, i)) for i, item in enumerate(value)]
        combine = all if key == "all" else any
        return lambda features: combine(part(features) for part in parts)
    if key == "not":
        inner = compile_condition(value, pools, path)
        return lambda features: not inner(features)
    name = _feature_name(key, pools, path)
    tests = value.items() if isinstance(value, Mapping) else [("eq", value)]
    if not tests:
        raise ConditionError(path, f"no operator given for '{name}'")
    checks = [_compile_test(op, operand, (*path, op)) for op, operand in tests]

    def predicate(features: Features) -> bool:
        current = features.value(name)
        return all(check(current) for check in checks)

    return predicate


def _feature_name(key: Any, pools: Collection[str], path: tuple[Any, ...]) -> str:
    if not isinstance(key, str):
        raise ConditionError(path, f"unknown feature {key!r}")
    if key.startswith("load."):
        pool = key.removeprefix("load.")
        if pool not in pools:
            raise ConditionError(path, f"'{key}' names unknown pool '{pool}' (pools: {', '.join(pools)})")
        return key
    if key not in FEATURE_NAMES:
        known = ", ".join([*FEATURE_NAMES, "load.<pool>", *COMBINATORS])
        raise ConditionError(path, f"unknown feature '{key}' (known: {known})")
    return key


def _compile_test(op: Any, operand: Any, path: tuple[Any, ...]) -> Callable[[Any], bool]:
    if op == "eq":
        return lambda value: value == operand
    if op == "ne":
        return lambda value: value != operand
    if op in _ORDERED:
        if isinstance(operand, bool) or not isinstance(operand, (int, float)):
            raise ConditionError(path, f"'{op}' needs a number, got {operand!r}")
        compare = _ORDERED[op]
        return lambda value: _is_number(value) and compare(value, operand)
    if op in ("in", "not_in"):
        if not isinstance(operand, list):
            raise ConditionError(path, f"'{op}' needs a list, got {operand!r}")
        members = tuple(operand)
        if op == "in":
            return lambda value: value in members
        return lambda value: value not in members
    if op == "matches":
        if not isinstance(operand, str):
            raise ConditionError(path, f"'matches' needs a regular expression string, got {operand!r}")
        try:
            pattern = re.compile(operand)
        except re.error as exc:
            raise ConditionError(path, f"invalid regular expression {operand!r}: {exc}") from None
        return lambda value: isinstance(value, str) and pattern.search(value) is not None
    raise ConditionError(path, f"unknown operator {op!r} (known: {', '.join(OPERATORS)})")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
