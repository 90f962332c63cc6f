"""The shape of the code: no module over 400 lines, no function over 60, and no
`noqa` or `type: ignore` comment without a reason after it on the same line.
The tests and the benchmarks are code too, and are held to the same shape.

Triton kernels (functions decorated with `triton.jit`) are exempt from the
function length: a kernel is one launch and reads best in one piece.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "backends", "specgate", "domains", "tests", "bench")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# A suppression directive, then what follows it on the line. The codes of a
# `noqa` ("E501, B008") or a `type: ignore` ("[arg-type]") are not a reason.
_NOQA = re.compile(r"#\s*noqa\b(?::\s*[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)?(?P<rest>.*)", re.IGNORECASE)
_TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?:\[[^\]]*\])?(?P<rest>.*)")
_WORD = re.compile(r"[A-Za-z]{2,}")


def modules() -> list[Path]:
    found = (path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
    return sorted(path for path in found if "__pycache__" not in path.parts)


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _is_triton_jit(decorator: ast.expr) -> bool:
    """`@triton.jit`, `@triton.jit(...)` or a `jit` imported from triton."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute):
        return target.attr == "jit" and isinstance(target.value, ast.Name) and target.value.id == "triton"
    return isinstance(target, ast.Name) and target.id == "jit"


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> Iterator[tuple[int, str, int]]:
    """(line, qualified name, length) of each function longer than `limit` lines, from `def` to its last line."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[int, str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit and not any(_is_triton_jit(d) for d in child.decorator_list):
                    yield child.lineno, name, length
                yield from visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(ast.parse(source), "")


def unexplained_suppressions(source: str) -> Iterator[tuple[int, str]]:
    """(line, comment) of each `noqa` or `type: ignore` with no reason after it on its line."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        for pattern in (_NOQA, _TYPE_IGNORE):
            match = pattern.search(token.string)
            if match and not _WORD.search(match.group("rest")):
                yield token.start[0], token.string
                break


def test_no_module_is_over_400_lines() -> None:
    too_long = [
        f"{_name(path)}: {count} lines"
        for path in modules()
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert too_long == []


def test_no_function_is_over_60_lines() -> None:
    too_long = [
        f"{_name(path)}:{line} {name}: {length} lines"
        for path in modules()
        for line, name, length in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert too_long == []


def test_every_suppression_says_why() -> None:
    bare = [
        f"{_name(path)}:{line} {comment}"
        for path in modules()
        for line, comment in unexplained_suppressions(path.read_text(encoding="utf-8"))
    ]
    assert bare == []


# The checks themselves -----------------------------------------------------


def _function(name: str, body_lines: int, decorator: str = "") -> str:
    head = f"{decorator}\n" if decorator else ""
    return head + f"def {name}():\n" + "    x = 1\n" * body_lines


def test_a_function_is_measured_from_def_to_its_last_line() -> None:
    source = _function("fits", MAX_FUNCTION_LINES - 1) + _function("over", MAX_FUNCTION_LINES)
    assert [(name, length) for _, name, length in long_functions(source)] == [("over", MAX_FUNCTION_LINES + 1)]


def test_methods_and_nested_functions_are_measured_and_named() -> None:
    method = "class Box:\n" + "\n".join("    " + line for line in _function("fill", 70).splitlines()) + "\n"
    nested = "def outer():\n" + "\n".join("    " + line for line in _function("inner", 70).splitlines()) + "\n"
    names = [name for _, name, _ in long_functions(method + nested)]
    assert names == ["Box.fill", "outer", "outer.inner"]


@pytest.mark.parametrize("decorator", ["@triton.jit", "@triton.jit(do_not_specialize=['n'])", "@jit"])
def test_triton_kernels_are_exempt(decorator: str) -> None:
    assert list(long_functions(_function("kernel", 100, decorator))) == []


def test_other_decorators_are_not_exempt() -> None:
    assert [name for _, name, _ in long_functions(_function("handler", 100, "@torch.no_grad()"))] == ["handler"]


@pytest.mark.parametrize(
    "line",
    [
        "x = 1  # noqa: BLE001 - the loop must survive anything",
        "x = 1  # noqa: E402, I001 (imported after the path is set)",
        "x = f()  # type: ignore[attr-defined]  # duck-typed: any error that carries a request",
        "x = f()  # type: ignore  stubs lack it",
        "x = 1  # a comment that mentions noqa-free code",
    ],
)
def test_a_suppression_with_a_reason_passes(line: str) -> None:
    assert list(unexplained_suppressions(line + "\n")) == []


@pytest.mark.parametrize(
    "line",
    [
        "x = 1  # noqa",
        "x = 1  # noqa: E501",
        "x = 1  # noqa: E501, B008 -",
        "x = f()  # type: ignore",
        "x = f()  # type: ignore[arg-type]",
        "x = f()  # fmt: skip  # noqa: E501",
    ],
)
def test_a_bare_suppression_fails(line: str) -> None:
    assert [number for number, _ in unexplained_suppressions(line + "\n")] == [1]


def test_a_suppression_named_in_a_string_is_not_a_comment() -> None:
    assert list(unexplained_suppressions('x = "# noqa"\n')) == []
