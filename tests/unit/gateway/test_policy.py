"""Policy validation: every mistake is reported with its file and line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy.loader import PolicyError, load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[3]

VALID = """\
version: 1
pools:
  fast:
    kind: speculative
    endpoints: [{url: "http://127.0.0.1:9001"}]
    fallback: slow
  slow:
    kind: standard
    endpoints: [{url: "http://127.0.0.1:9002", weight: 2}]
rules:
  - name: greedy
    when: {temperature: {le: 0.3}}
    route: fast
  - name: rest
    route: slow
"""


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    return str(info.value).splitlines()


def test_valid_policy_loads():
    policy = parse_policy(VALID, "p.yaml")
    assert [r.name for r in policy.rules] == ["greedy", "rest"]
    assert policy.default_pool == "slow"
    assert policy.pools["slow"].endpoints[0].weight == 2


@pytest.mark.parametrize("old,new,expected", [
    ("    fallback: slow\n", "    fallback: slow\n    colour: red\n",
     "p.yaml:7: pools.fast.colour: unknown key"),
    ("kind: standard", "kind: turbo",
     "p.yaml:8: pools.slow.kind: Input should be 'speculative', 'standard' or 'dynamic'"),
    ("route: fast", "route: nowhere", "p.yaml:13: rules[0].route: unknown pool 'nowhere'"),
    ("name: rest", "name: greedy", "p.yaml:14: rules[1].name: duplicate rule name 'greedy'"),
    ("{temperature: {le: 0.3}}", "{temprature: {le: 0.3}}", "p.yaml:12: rules[0].when.temprature: unknown feature"),
    ("{temperature: {le: 0.3}}", "{temperature: {around: 0.3}}",
     "p.yaml:12: rules[0].when.temperature.around: unknown operator"),
    ("{temperature: {le: 0.3}}", "{temperature: {le: low}}",
     "p.yaml:12: rules[0].when.temperature.le: 'le' needs a number"),
    ("{temperature: {le: 0.3}}", "{load.turbo: {ge: 2}}",
     "p.yaml:12: rules[0].when.load.turbo: 'load.turbo' names unknown pool"),
    ("{temperature: {le: 0.3}}", "{domain: {matches: '('}}",
     "p.yaml:12: rules[0].when.domain.matches: invalid regular expression"),
    ('"http://127.0.0.1:9002"', '"127.0.0.1:9002"',
     "p.yaml:9: pools.slow.endpoints[0].url: Value error, endpoint url must start"),
    ("version: 1", "version: 2", "p.yaml:1: version: Input should be 1"),
    ("    fallback: slow\n", "    fallback: ghost\n", "p.yaml:6: pools.fast.fallback: unknown pool 'ghost'"),
    ("  - name: rest\n    route: slow\n", "", None),  # still valid: one rule
])
def test_errors_name_file_line_and_field(old, new, expected):
    text = VALID.replace(old, new, 1)
    assert text != VALID
    if expected is None:
        parse_policy(text, "p.yaml")
        return
    found = problems(text)
    assert any(line.startswith(expected) for line in found), found


def test_fallback_cycle_is_an_error():
    text = VALID.replace("    kind: standard\n", "    kind: standard\n    fallback: fast\n")
    found = problems(text)
    assert any("p.yaml:6: pools.fast.fallback: fallback chain from 'fast' loops: fast -> slow -> fast" in f
               for f in found), found


@pytest.mark.parametrize("text,line,fragment", [
    ("version: 1\npools: [1, 2\n", 3, "invalid YAML"),
    ("version: 1\nversion: 1\n", 2, "duplicate key 'version'"),
    ("- just\n- a list\n", 1, "must be a YAML mapping"),
    ("", 1, "must be a YAML mapping"),
    ("version: 1\n", 1, "pools: required field is missing"),
])
def test_broken_yaml(text, line, fragment):
    found = problems(text)
    assert any(f.startswith(f"p.yaml:{line}:") and fragment in f for f in found), found


def test_api_keys_are_environment_references_only():
    text = VALID.replace("    fallback: slow\n", "    fallback: slow\n    api_key: sk-live-123\n")
    assert any("api_key must reference the environment" in f for f in problems(text))


def test_shipped_policies_are_valid():
    for path in [ROOT / "policies" / "default.yaml", *sorted((ROOT / "policies" / "examples").glob("*.yaml"))]:
        load_policy(path)


@pytest.mark.slow
def test_check_command_exit_codes(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(VALID)
    bad = tmp_path / "bad.yaml"
    bad.write_text(VALID.replace("route: fast", "route: nowhere"))
    cli = [sys.executable, "-m", "specgate.cli", "check"]
    ok = subprocess.run([*cli, str(good)], capture_output=True, text=True, cwd=ROOT)
    failed = subprocess.run([*cli, str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert failed.returncode == 1
    assert f"{bad}:13: rules[0].route: unknown pool 'nowhere'" in failed.stderr


# -- fuzzing the loader: any input gives a Policy or a PolicyError with a line, nothing else

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
trees = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(
    st.sampled_from(["version", "pools", "rules", "kind", "endpoints", "url", "route", "name", "when",
                     "fallback", "guard", "domains", "patterns", "gt", "all", "load.standard", "x"]),
    c, max_size=4), max_leaves=20)


def _loads_or_reports(text: str) -> None:
    try:
        parse_policy(text, "f.yaml")
    except PolicyError as exc:
        assert exc.problems and all(line >= 1 for line, _ in exc.problems)
        assert str(exc).startswith("f.yaml:")


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_loader_survives_any_text(text):
    _loads_or_reports(text)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(trees)
def test_loader_survives_any_structure(tree):
    _loads_or_reports(yaml.safe_dump(tree))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.data())
def test_loader_survives_mutations_of_a_valid_policy(data):
    lines = VALID.splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    lines[i] = data.draw(st.sampled_from(["", "  - ", ":", lines[i] + " junk: [", lines[i].replace(":", ""),
                                          lines[i].strip(), "    " + lines[i]]))
    _loads_or_reports("\n".join(lines))
