"""Build a draft dataset (`specgate draft data`): render answered prompts with the
target's chat template, tokenize, mask the answers.

Reads prompts JSONL files (from `specgate draft capture`, or any file of the
same shape), keeps each distinct conversation once, lets the target answer
each one through an OpenAI-compatible URL (the standard pool), and writes the
dataset that draft training reads (format: specgate/draft/dataset.py) to
`--out`. A rerun with the same `--out` asks only the prompts not yet answered.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specgate.draft import dataset, prompts


def build(chosen: list[prompts.Prompt], answers: dict[str, str], out: Path, tokenizer: Any,
          max_length: int, progress: bool = False) -> dict[str, Any]:
    """Tokenize every answered prompt with its answer and write the dataset."""
    from tqdm import tqdm

    from specgate.draft.template import tokenize

    records = []
    for prompt in tqdm(chosen, desc="tokenizing", unit="prompt", disable=not progress):
        if prompt.id not in answers:
            continue
        messages = [*prompt.as_messages(), {"role": "assistant", "content": answers[prompt.id]}]
        ids, mask = tokenize(tokenizer, messages)
        ids, mask = ids[:max_length], mask[:max_length]
        if any(mask):
            records.append(dataset.Record(prompt.id, prompt.traffic_class, ids, mask, prompt.source))
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    return dataset.write_dataset(out, records, Path(name).name)


def tokenizer_of(model_dir: Path | None) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tokenizer is local; never reach for a hub
    from transformers import AutoTokenizer

    if model_dir is None:
        from backends.model import prepare

        model_dir = prepare()
    return AutoTokenizer.from_pretrained(model_dir)
