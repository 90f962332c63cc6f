"""The data of the shipped head: prompts answered by the target itself, in-process.

`specgate draft data` answers prompts through an OpenAI-compatible URL. To
build the shipped SmolLM2-135M-Instruct head on one machine without serving
the model, this module answers them with transformers directly: greedy,
batched, the prompt rendered with the target's chat template. The result is a
dataset directory in `specgate.draft.dataset`'s format (loss mask on the
answer and its end-of-turn token), which `specgate draft train` reads.

    python -m specgate.draft.ship --prompts PROMPTS.jsonl [...] --out DIR

A prompts line is `{"messages": [{"role": ..., "content": ...}, ...]}` or
`{"prompt": "..."}`; a "class" field, if present, is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specgate.draft.dataset import FORMAT, MANIFEST, RECORDS, VERSION, Record


def read_prompts(paths: list[Path]) -> Iterator[tuple[list[dict[str, str]], str | None]]:
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            messages = item.get("messages") or [{"role": "user", "content": str(item["prompt"])}]
            while messages and messages[-1].get("role") == "assistant":
                messages = messages[:-1]  # the target writes the answer itself
            if messages:
                yield [{"role": m["role"], "content": m["content"]} for m in messages], item.get("class")


def answer_batch(model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy answers (token ids, end-of-turn included when reached) of a batch of prompts."""
    import torch

    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)  # fmt: skip
    answers = []
    for row in out[:, width:].tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id) + 1]
        answers.append(row)
    return answers


def build(prompt_files: list[Path], out: Path, model_dir: Path, max_new_tokens: int = 160,
          batch_size: int = 8, max_prompt_tokens: int = 640) -> int:
    """Answer every prompt and write the dataset directory; returns the record count."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from specgate.draft.features import load_target

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = load_target(model_dir)
    items = []
    for messages, traffic_class in read_prompts(prompt_files):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        if len(ids) <= max_prompt_tokens:
            key = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]
            items.append((key, traffic_class, ids))
    out.mkdir(parents=True, exist_ok=True)
    records = tokens = masked = 0
    with (out / RECORDS).open("w", encoding="utf-8") as sink:
        for start in tqdm(range(0, len(items), batch_size), desc="answers", unit="batch"):
            chunk = items[start : start + batch_size]
            answers = answer_batch(model, tokenizer, [ids for _, _, ids in chunk], max_new_tokens)
            for (key, traffic_class, ids), answer in zip(chunk, answers, strict=True):
                if not answer:
                    continue
                record = Record(key, traffic_class, ids + answer, [0] * len(ids) + [1] * len(answer))
                sink.write(json.dumps(record.to_json()) + "\n")
                records, tokens, masked = records + 1, tokens + len(record.input_ids), masked + len(answer)
    manifest = {"format": FORMAT, "version": VERSION, "tokenizer": model_dir.name, "records": records,
                "tokens": tokens, "masked_tokens": masked}  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return records


def main(argv: list[str] | None = None) -> int:
    from backends.model import prepare

    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--prompts", nargs="+", required=True, type=Path, help="prompts JSONL files")
    parser.add_argument("--out", required=True, type=Path, help="dataset directory to write")
    parser.add_argument("--model", type=Path, help="target model folder (default: the prepared SmolLM2)")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    count = build(args.prompts, args.out, args.model or prepare(), args.max_new_tokens, args.batch_size)
    print(f"{count} records in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
