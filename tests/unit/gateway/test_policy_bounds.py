"""A policy file cannot make the loader build something huge: alias bombs,
oversized files and deep nesting are refused with a clear PolicyError."""

from __future__ import annotations

import pytest

from gateway.policy.loader import PolicyError, load_policy, parse_policy
from gateway.policy.yaml_lines import MAX_BYTES, MAX_DEPTH, MAX_NODES

VALID = ("version: 1\npools:\n  a: {kind: standard, endpoints: [{url: 'http://127.0.0.1:1'}]}\n"
         "rules:\n  - {name: r, route: a}\n")


def alias_bomb() -> str:
    """The billion laughs in YAML: about a kilobyte that expands to 10**9 strings."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        previous = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def deep(levels: int) -> str:
    return "x: " + "[" * levels + "]" * levels + "\n"


def problems(error: pytest.ExceptionInfo[PolicyError]) -> str:
    return " ".join(message for _, message in error.value.problems)


def test_an_alias_bomb_is_refused_before_it_expands():
    text = alias_bomb()
    assert len(text) < 1200
    with pytest.raises(PolicyError) as error:
        parse_policy(text, "bomb.yaml")
    assert f"over {MAX_NODES} values once its aliases are expanded" in problems(error)


def test_an_alias_a_dumper_writes_for_a_repeated_value_still_loads():
    text = VALID.replace("  a: {kind: standard, endpoints: [{url: 'http://127.0.0.1:1'}]}\n",
                         "  a: {kind: standard, endpoints: [{url: 'http://127.0.0.1:1'}], timeouts: &t {total_s: 9}}\n"
                         "  b: {kind: standard, endpoints: [{url: 'http://127.0.0.1:2'}], timeouts: *t}\n")
    policy = parse_policy(text)
    assert [pool.timeouts.total_s for pool in policy.spec.pools.values()] == [9, 9]


def test_a_50_mb_file_is_refused_without_being_read_whole(tmp_path):
    path = tmp_path / "huge.yaml"
    with path.open("w") as file:
        file.write(VALID)
        file.write(("# " + "x" * 1022 + "\n") * (50 * 1024))  # 50 MiB of comments
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    assert f"over the {MAX_BYTES} byte limit" in problems(error)


def test_text_over_the_limit_is_refused_by_the_parser_too():
    with pytest.raises(PolicyError) as error:
        parse_policy(VALID + "#" * MAX_BYTES)
    assert "byte limit" in problems(error)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 10_000])
def test_deep_nesting_is_refused(levels):
    with pytest.raises(PolicyError) as error:
        parse_policy(VALID + deep(levels))
    assert f"nested deeper than {MAX_DEPTH} levels" in problems(error)


def test_a_policy_within_the_bounds_loads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(VALID + "domains:\n  code: {patterns: ['x'], keywords: [" + ",".join(["w"] * 100) + "]}\n")
    assert list(load_policy(path).pools) == ["a"]
