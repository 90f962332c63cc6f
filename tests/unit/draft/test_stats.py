"""A dataset's statistics: totals, per class and per source, length percentiles, the command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from specgate.commands.draft import stats as command
from specgate.draft import dataset, stats


def records() -> list[dataset.Record]:
    return [
        dataset.Record("a", "chat/greedy", [1, 2, 3, 4, 5], [0, 0, 1, 1, 1], "templates"),
        dataset.Record("b", "chat/greedy", [1, 2, 3], [0, 0, 1], "packages"),
        dataset.Record("c", "code/greedy", [1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 1, 0, 1, 1, 1], "templates"),
        dataset.Record("d", None, [1, 2], [0, 1]),
    ]


def test_totals_groups_and_percentiles() -> None:
    numbers = stats.of(records())
    assert (numbers["records"], numbers["tokens"], numbers["answer_tokens"]) == (4, 18, 9)
    assert numbers["by_class"] == {"-": {"records": 1, "tokens": 2, "answer_tokens": 1},
                                   "chat/greedy": {"records": 2, "tokens": 8, "answer_tokens": 4},
                                   "code/greedy": {"records": 1, "tokens": 8, "answer_tokens": 4}}
    assert numbers["by_source"]["templates"] == {"records": 2, "tokens": 13, "answer_tokens": 7}
    assert numbers["by_source"]["-"]["records"] == 1 and numbers["by_source"]["packages"]["tokens"] == 3
    # prompt lengths 2, 2, 4, 1 and answer lengths 3, 1, 4, 1, nearest rank
    assert numbers["prompt_tokens"] == {"p50": 2, "p90": 4, "p99": 4, "p100": 4}
    assert numbers["answer_tokens_per_record"] == {"p50": 1, "p90": 4, "p99": 4, "p100": 4}
    assert stats.percentiles([]) == {"p50": 0, "p90": 0, "p99": 0, "p100": 0}


def test_the_source_survives_the_dataset_files(tmp_path: Path) -> None:
    dataset.write_dataset(tmp_path, records(), "tok")
    assert [r.source for r in dataset.read_records(tmp_path)] == ["templates", "packages", "templates", None]


def test_the_command_prints_tables_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset.write_dataset(tmp_path, records(), "tok")
    assert command.run(argparse.Namespace(data=tmp_path, json=False)) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "4 records, 18 tokens, 9 answer tokens"
    assert any(line.split() == ["templates", "2", "13", "7"] for line in table)
    assert table[-1] == "answer tokens per record: p50 1, p90 4, p99 4, p100 4"
    assert command.run(argparse.Namespace(data=tmp_path, json=True)) == 0
    assert json.loads(capsys.readouterr().out) == stats.of(records())
