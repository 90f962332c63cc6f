"""The corpus sources: seeded, distinct across sources, every row a usable prompt with its source."""

from __future__ import annotations

import json
import random
from pathlib import Path

from specgate.draft import prompts
from specgate.draft.corpus import build, packages, stdlib

COUNTS = {"templates": 300, "puzzles": 200, "stdlib": 0, "packages": 40}


def test_the_same_seed_writes_the_same_prompts_and_another_seed_others() -> None:
    first, again, other = build.generate(7, COUNTS), build.generate(7, COUNTS), build.generate(8, COUNTS)
    assert first == again
    assert first["templates"] != other["templates"] and first["puzzles"] != other["puzzles"]


def test_rows_are_usable_prompts_that_name_their_source_and_are_distinct_across_sources() -> None:
    rows = build.generate(7, COUNTS)
    assert len(rows["templates"]) == 300 and len(rows["puzzles"]) == 200 and rows["stdlib"] == []
    ids: set[str] = set()
    classes: set[str] = set()
    for source, items in rows.items():
        for row in items:
            prompt = prompts.parse(row)
            assert prompt is not None and prompt.source == source == row["source"]
            assert prompt.id not in ids
            ids.add(prompt.id)
            classes.add(str(row["class"]))
    assert {"chat/greedy", "summarization/greedy", "code/greedy", "math/greedy"} <= classes
    turns = [prompts.parse(row) for row in rows["templates"]]
    assert any(prompt is not None and len(prompt.messages) == 3 for prompt in turns)


def test_stdlib_prompts_come_from_public_documented_functions_of_the_files(tmp_path: Path) -> None:
    code = ('def area(width, height):\n    """Return the area of a rectangle of the given width and height."""\n'
            '    return width * height\n\n\ndef _hidden(x):\n'
            '    """A private helper with a long enough docstring."""\n'
            '    return x\n\n\ndef bare(x):\n    return x\n')
    (tmp_path / "shapes.py").write_text(code)
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "other.py").write_text(code.replace("area", "volume"))
    found = stdlib.functions(tmp_path)
    assert [(module, name) for module, name, _, _ in found] == [("shapes", "area")]
    rows = stdlib.make(random.Random(0), 5, root=tmp_path)
    assert len(rows) == 1 and rows[0]["source"] == "stdlib"
    prompt = prompts.parse(rows[0])
    assert prompt is not None
    text = prompt.messages[-1][1]
    assert "rectangle" in text or "width * height" in text


def test_package_descriptions_keep_prose_and_drop_markup() -> None:
    body = ("# Title\n\n[![badge](https://x)](https://y)\n\n"
            "This library parses calendar files and turns them into plain Python objects for scheduling apps.\n\n"
            "```python\nimport x\n```\n\n| a | b |\n|---|---|\n")
    assert packages._prose(body) == ("This library parses calendar files and turns them into plain Python "
                                     "objects for scheduling apps.")


def test_the_command_writes_one_file_per_source(tmp_path: Path) -> None:
    assert build.main(["--out", str(tmp_path), "--count", "stdlib=0", "--count", "templates=20",
                       "--count", "puzzles=10", "--count", "packages=5"]) == 0
    written = {path.stem: [json.loads(line) for line in path.read_text().splitlines()]
               for path in tmp_path.glob("*.jsonl")}
    assert {name: len(rows) for name, rows in written.items()} == {"templates": 20, "puzzles": 10, "stdlib": 0,
                                                                    "packages": 5}
