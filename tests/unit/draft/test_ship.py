"""The shipped head's prompts reader: the target writes every answer itself."""

from __future__ import annotations

import json
from pathlib import Path

from specgate.draft.ship import read_prompts


def test_prompts_keep_their_turns_and_class_and_drop_a_trailing_answer(tmp_path: Path) -> None:
    lines = [
        {"prompt": "Name a colour."},
        {"class": "chat", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                                       {"role": "user", "content": "Bye?"}]},
        {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "an answer to drop"}]},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    read = list(read_prompts([path]))
    assert read[0] == ([{"role": "user", "content": "Name a colour."}], None)
    assert read[1][1] == "chat" and [m["role"] for m in read[1][0]] == ["user", "assistant", "user"]
    assert read[2] == ([{"role": "user", "content": "Q"}], None)
