"""Prompts about the Python standard library's own code: its functions'
docstrings (summarise, explain, give an example) and their source (explain,
add a docstring, write a test). Read with `ast` from the installed standard
library's files, never imported; the same Python version gives the same
prompts."""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

SOURCE = "stdlib"
Row = dict[str, object]
MAX_CODE_CHARS = 1200
MAX_DOC_CHARS = 900
SKIPPED = frozenset({"site-packages", "dist-packages", "idlelib", "turtledemo", "lib2to3", "ensurepip"})

ON_DOC = ["Summarise what this Python documentation says, in plain words:\n\n{d}",
          "Here is the docstring of `{m}.{f}`. Explain when I would use it:\n\n{d}",
          "Based on this documentation of `{m}.{f}`, write a short usage example:\n\n{d}"]
ON_CODE = ["Explain what this Python function from `{m}` does:\n```python\n{c}\n```",
           "Write a short docstring for this function:\n```python\n{c}\n```",
           "Suggest one unit test for this function:\n```python\n{c}\n```",
           "Is there anything in this code that could be simplified?\n```python\n{c}\n```"]


def functions(root: Path) -> list[tuple[str, str, str, str]]:
    """(module, function, docstring, source) of the public top-level functions
    and methods that have a docstring, in file order."""
    found = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        folder = path.relative_to(root).parts[0] if path.parent != root else ""
        if folder in SKIPPED or "test" in folder or path.name.startswith(("_", "test")):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                code = ast.get_source_segment(text, node)
                if doc and code and 40 < len(doc) and len(code) <= MAX_CODE_CHARS:
                    found.append((module, node.name, doc[:MAX_DOC_CHARS], code))
    return found


def make(rng: random.Random, count: int, root: Path | None = None) -> list[Row]:
    if count <= 0:
        return []
    pool = functions(root or Path(sysconfig.get_paths()["stdlib"]))
    rng.shuffle(pool)
    out: list[Row] = []
    for module, name, doc, code in pool[:count]:
        if rng.random() < 0.5:
            traffic_class, text = "summarization/greedy", rng.choice(ON_DOC).format(d=doc, m=module, f=name)
        else:
            traffic_class, text = "code/greedy", rng.choice(ON_CODE).format(c=code, m=module)
        out.append({"class": traffic_class, "source": SOURCE, "messages": [{"role": "user", "content": text}]})
    return out
