"""The tokenized draft-training set that `specgate draft data` writes and training reads.

Layout of a dataset directory (`--out DIR` of `specgate draft data`):

    DIR/manifest.json   {"format": "specgate-draft-dataset", "version": 1,
                         "tokenizer": <model directory name>, "records": N,
                         "tokens": total tokens, "masked_tokens": tokens in the loss}
    DIR/dataset.jsonl   one conversation a line:
                        {"id": "<sha256 of the prompt messages, 16 hex>",
                         "class": "<traffic class or null>",
                         "source": "<prompt source or null>",  (optional)
                         "input_ids": [int, ...],   the conversation rendered with the
                                                    target's chat template, tokenized
                         "loss_mask": [0|1, ...]}   same length: 1 on the tokens of every
                                                    assistant answer (its end-of-turn token
                                                    included), 0 on system/user turns and
                                                    the template's role headers
    DIR/answers.jsonl   the regenerated answers (text), kept so a rerun resumes

A record's `input_ids` start at the template's first token; no padding is
stored: a reader batches and pads as it likes. Every record has at least one
masked token.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "specgate-draft-dataset"
VERSION = 1
MANIFEST = "manifest.json"
RECORDS = "dataset.jsonl"
ANSWERS = "answers.jsonl"


@dataclass(frozen=True)
class Record:
    id: str
    traffic_class: str | None
    input_ids: list[int]
    loss_mask: list[int]
    source: str | None = None  # the prompt generator or file it came from, when known

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "class": self.traffic_class, "source": self.source, "input_ids": self.input_ids,
                "loss_mask": self.loss_mask}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        record = cls(str(data["id"]), data.get("class"), [int(t) for t in data["input_ids"]],
                     [int(m) for m in data["loss_mask"]], data.get("source"))
        if len(record.input_ids) != len(record.loss_mask):
            raise ValueError(f"record {record.id}: {len(record.input_ids)} tokens but "
                             f"{len(record.loss_mask)} mask entries")
        if not any(record.loss_mask) or any(m not in (0, 1) for m in record.loss_mask):
            raise ValueError(f"record {record.id}: the loss mask must be 0/1 with at least one 1")
        return record


def read_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} v{VERSION} manifest")
    return manifest


def read_records(directory: str | Path) -> Iterator[Record]:
    """The records of a dataset directory, in file order."""
    read_manifest(directory)
    with (Path(directory) / RECORDS).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield Record.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{RECORDS}:{number}: {exc}") from None


def read_datasets(directories: str | Path | Sequence[str | Path]) -> Iterator[Record]:
    """The records of one dataset directory, or of several one after another."""
    for directory in [directories] if isinstance(directories, str | Path) else directories:
        yield from read_records(directory)


def write_dataset(directory: str | Path, records: list[Record], tokenizer: str) -> dict[str, Any]:
    """Write the records and their manifest (the manifest last: its presence means complete)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    with (out / RECORDS).open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
    manifest = {"format": FORMAT, "version": VERSION, "tokenizer": tokenizer, "records": len(records),
                "tokens": sum(len(r.input_ids) for r in records),
                "masked_tokens": sum(sum(r.loss_mask) for r in records)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest
