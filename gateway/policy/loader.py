"""Loading the routing policy: `load_policy` and `parse_policy` turn a YAML
file into a checked, compiled `Policy` (compiled.py), or a `PolicyError`.

Every mistake is reported with the file and line it sits on
(`policies/x.yaml:12: rules[2].route: unknown pool 'fast'`); an unknown key is
an error, never ignored. Pydantic checks each field (schema.py); the loader
adds the rules across fields (names that must exist, fallback loops) and
compiles each rule's `when:` (conditions.py).
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import ValidationError

from domains.classifier import DomainClassifier, DomainRule
from gateway.policy.compiled import CompiledRule, Policy
from gateway.policy.conditions import ConditionError, compile_condition
from gateway.policy.pools import PoolSpec, fallback_chain
from gateway.policy.schema import FASTEST, PolicySpec
from gateway.policy.yaml_lines import YamlError, load_with_lines, read_text


class PolicyError(ValueError):
    """One or more problems, each `path:line: message`."""

    def __init__(self, path: str, problems: list[tuple[int, str]]) -> None:
        self.path = path
        self.problems = sorted(problems)
        super().__init__("\n".join(f"{path}:{line}: {msg}" for line, msg in self.problems))


def load_policy(path: str | os.PathLike[str]) -> Policy:
    path = str(path)
    try:
        text = read_text(path)  # bounded: a huge file is refused without being read whole
    except (OSError, ValueError) as exc:  # YamlError and UnicodeDecodeError are ValueErrors
        raise PolicyError(path, [(1, f"cannot read policy: {exc}")]) from None
    return parse_policy(text, path)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    try:
        data, lines = load_with_lines(text)
    except YamlError as exc:
        raise PolicyError(source, [(exc.line, exc.message)]) from None
    if not isinstance(data, dict):
        raise PolicyError(source, [(1, "a policy must be a YAML mapping (version, pools, rules, ...)")])
    try:
        spec = PolicySpec.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(source, [_located(err, lines) for err in exc.errors()]) from None
    problems = [(_line_of(path, lines), f"{_dotted(path)}: {msg}") for path, msg in _check(spec)]
    rules: list[CompiledRule] = []
    for i, rule in enumerate(spec.rules):
        try:
            matches = None if rule.when is None else compile_condition(rule.when, spec.pools, ("rules", i, "when"))
        except ConditionError as exc:
            problems.append((_line_of(exc.path, lines), f"{_dotted(exc.path)}: {exc.message}"))
            continue
        candidates = tuple(dict.fromkeys(rule.candidates or spec.pools)) if rule.route == FASTEST else ()
        reason = rule.reason or (f"matched {rule.when}" if rule.when else "catch-all")
        rules.append(CompiledRule(rule.name, rule.route, reason, matches, candidates))
    if problems:
        raise PolicyError(source, problems)
    classifier = DomainClassifier((DomainRule(name, d.patterns, d.keywords) for name, d in spec.domains.items()),
                                  default=spec.default_domain)
    return Policy(spec=spec, source=source, rules=tuple(rules), classifier=classifier)


def _check(spec: PolicySpec) -> list[tuple[tuple[Any, ...], str]]:
    """Cross-field rules pydantic cannot express: names that must exist, cycles."""
    pools = spec.pools
    problems: list[tuple[tuple[Any, ...], str]] = []
    if spec.default_pool is not None and spec.default_pool not in pools:
        problems.append((("default_pool",), f"unknown pool '{spec.default_pool}'"))
    for name, pool in pools.items():
        if pool.fallback is None:
            continue
        if pool.fallback not in pools:
            problems.append((("pools", name, "fallback"), f"unknown pool '{pool.fallback}'"))
        elif _fallback_cycle(name, pools):
            problems.append((("pools", name, "fallback"),
                             f"fallback chain from '{name}' loops: {' -> '.join(_fallback_cycle(name, pools))}"))
    if FASTEST in pools:
        problems.append((("pools", FASTEST), f"'{FASTEST}' is a route, not a pool name"))
    seen: dict[str, int] = {}
    for i, rule in enumerate(spec.rules):
        if rule.route not in pools and rule.route != FASTEST:
            problems.append((("rules", i, "route"),
                             f"unknown pool '{rule.route}' (pools: {', '.join(pools)}, or {FASTEST})"))
        if rule.candidates is not None and rule.route != FASTEST:
            problems.append((("rules", i, "candidates"), f"candidates go with route: {FASTEST} only"))
        problems += [(("rules", i, "candidates", j), f"unknown pool '{name}' (pools: {', '.join(pools)})")
                     for j, name in enumerate(rule.candidates or ()) if name not in pools]
        if rule.name in seen:
            problems.append((("rules", i, "name"),
                             f"duplicate rule name '{rule.name}' (also rules[{seen[rule.name]}])"))
        seen.setdefault(rule.name, i)
    return problems


def _fallback_cycle(start: str, pools: dict[str, PoolSpec]) -> list[str]:
    """The loop through `start`, e.g. [a, b, a]; [] when its chain does not come back to it."""
    chain = fallback_chain(pools, start)
    return [*chain, start] if pools[chain[-1]].fallback == start else []


def _located(err: Any, lines: dict[tuple[Any, ...], int]) -> tuple[int, str]:
    loc, message = tuple(err["loc"]), err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown key (not part of the policy schema)"
    elif err["type"] == "missing":
        message = "required field is missing"
    return _line_of(loc, lines), f"{_dotted(loc)}: {message}"


def _line_of(path: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> int:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return 1


def _dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top>"
