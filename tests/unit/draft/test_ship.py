"""The in-process answering's prompt reader and its resumable chunks."""

from __future__ import annotations

import json
from pathlib import Path

from specgate.draft import dataset
from specgate.draft.ship import _write_chunk, assemble, chunk_lines, read_prompts


def test_prompts_keep_their_turns_class_and_source_and_drop_a_trailing_answer(tmp_path: Path) -> None:
    lines = [
        {"prompt": "Name a colour."},
        {"class": "chat", "source": "templates", "messages": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye?"}]},
        {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "an answer to drop"}]},
        {"prompt": "Name a colour."},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    read = list(read_prompts([path]))
    assert len(read) == 3  # the repeated prompt once
    assert read[0].as_messages() == [{"role": "user", "content": "Name a colour."}] and read[0].source is None
    assert read[1].traffic_class == "chat" and read[1].source == "templates"
    assert [m["role"] for m in read[1].as_messages()] == ["user", "assistant", "user"]
    assert read[2].as_messages() == [{"role": "user", "content": "Q"}]


def test_chunks_accumulate_and_the_dataset_holds_every_answered_record(tmp_path: Path) -> None:
    first = dataset.Record("a", "chat/greedy", [1, 2, 3], [0, 1, 1], "templates")
    second = dataset.Record("b", "code/greedy", [4, 5], [0, 1], "stdlib")
    _write_chunk(tmp_path, [first.to_json(), {"id": "e", "empty": True}])
    _write_chunk(tmp_path, [second.to_json()])
    (tmp_path / "chunks" / ".chunk-00002.tmp").write_text('{"id": "torn"')  # a run killed mid-chunk
    assert [line["id"] for line in chunk_lines(tmp_path)] == ["a", "e", "b"]
    manifest = assemble(tmp_path, "tok")
    assert (manifest["records"], manifest["masked_tokens"]) == (2, 3)
    assert list(dataset.read_records(tmp_path)) == [first, second]
