"""`specgate draft capture`: the capture files to a deduplicated prompts JSONL."""

from __future__ import annotations

import json

import pytest

from gateway.capture.files import CaptureFiles
from specgate.cli import main


def record(text: str, traffic_class: str, system: str | None = None) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return json.dumps({"time": "2026-01-01T00:00:00Z", "class": traffic_class, "endpoint": "chat",
                       "messages": messages})


def test_export_dedupes_filters_by_class_and_skips_unusable_lines(tmp_path, capsys):
    files = CaptureFiles(tmp_path / "cap", max_file_bytes=2048, max_files=10, retention_days=1)
    files.append([record("Hi <EMAIL>", "chat/low"), record("Hi <EMAIL>", "chat/low"),
                  record("Hi <EMAIL>", "chat/low", system="Be brief.")])
    files.current = None  # a second file
    files.append([record("def f(): pass", "code/low"), record("Hi <EMAIL>", "chat/low"), "{not json", "{}"])
    out = tmp_path / "prompts.jsonl"
    assert main(["draft", "capture", "--dir", str(tmp_path / "cap"), "--out", str(out), "--class", "chat/low"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [[m["content"] for m in r["messages"]] for r in rows] == [["Hi <EMAIL>"], ["Be brief.", "Hi <EMAIL>"]]
    assert all(r["class"] == "chat/low" and len(r["id"]) == 16 for r in rows)
    assert "2 duplicates, 1 filtered, 2 unusable" in capsys.readouterr().err

    assert main(["draft", "capture", "--dir", str(tmp_path / "cap"), "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_an_empty_directory_is_a_one_line_error(tmp_path, capsys):
    assert main(["draft", "capture", "--dir", str(tmp_path), "--out", str(tmp_path / "p.jsonl")]) == 1
    assert "no capture-*.jsonl files" in capsys.readouterr().err


@pytest.mark.parametrize("sub", ["capture", "data"])
def test_help(sub, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["draft", sub, "--help"])
    assert exit_.value.code == 0 and "--out" in capsys.readouterr().out
