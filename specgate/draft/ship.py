"""Answers by the target itself, in-process, in resumable chunks.

`specgate draft data` answers prompts through an OpenAI-compatible URL. To
build a head on one machine without serving the model, this module answers
them with transformers directly: greedy, batched (prompts of similar length
together), the prompt rendered with the target's chat template. Answers are
written chunk by chunk under `OUT/chunks/` (a chunk file appears whole, by
rename, or not at all), so a run stopped at any point resumes with the
prompts no chunk holds; `--time-limit` stops a run by itself after the chunk
in progress. Each run then writes the dataset directory (format:
`specgate.draft.dataset`; loss mask on the answer and its end-of-turn token)
from every chunk, which `specgate draft train` reads.

    python -m specgate.draft.ship --prompts PROMPTS.jsonl [...] --out DIR [--time-limit 3600]

A prompts line is `{"messages": [...], "class": ..., "source": ...}` or
`{"prompt": "..."}`; a trailing assistant turn is dropped (the target writes
the answer), and the class and source are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specgate.draft import dataset, prompts, stats
from specgate.draft.dataset import Record

CHUNKS = "chunks"


def read_prompts(paths: list[Path]) -> Iterator[prompts.Prompt]:
    """The usable prompts of the files, each once, a trailing answer dropped."""
    seen: set[str] = set()
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            messages = list(item.get("messages") or [])
            while messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
                messages.pop()  # the target writes the answer itself
            prompt = prompts.parse({**item, "messages": messages} if messages else item)
            if prompt is not None and prompt.id not in seen:
                seen.add(prompt.id)
                yield prompt


def answer_batch(model: Any, batch: list[list[int]], max_new_tokens: int, end: int) -> list[list[int]]:
    """Greedy answers (token ids, the end-of-turn token `end` included when
    reached) of a batch of prompts, left-padded with `end`."""
    import torch

    width = max(len(p) for p in batch)
    ids = torch.tensor([[end] * (width - len(p)) + p for p in batch], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=end, pad_token_id=end)  # fmt: skip
    return [row[: row.index(end) + 1] if end in row else row for row in out[:, width:].tolist()]


def chunk_lines(out: Path) -> Iterator[dict[str, Any]]:
    """Every line of the finished chunks, in chunk order."""
    for path in sorted((out / CHUNKS).glob("chunk-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield json.loads(line)


def assemble(out: Path, tokenizer_name: str) -> dict[str, Any]:
    """The dataset directory from every finished chunk (an empty answer is left out)."""
    records = [Record.from_json(line) for line in chunk_lines(out) if "input_ids" in line]
    return dataset.write_dataset(out, records, tokenizer_name)


def _write_chunk(out: Path, lines: list[dict[str, Any]]) -> None:
    directory = out / CHUNKS
    directory.mkdir(parents=True, exist_ok=True)
    number = len(list(directory.glob("chunk-*.jsonl")))
    staging = directory / f".chunk-{number:05d}.tmp"
    staging.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines), encoding="utf-8")
    staging.rename(directory / f"chunk-{number:05d}.jsonl")


def build(prompt_files: list[Path], out: Path, model_dir: Path, max_new_tokens: int = 160, batch_size: int = 8,
          max_prompt_tokens: int = 640, chunk_size: int = 64, time_limit_s: float | None = None,
          progress: bool = True, device: str = "cpu") -> dict[str, Any]:
    """Answer the prompts no chunk holds yet, chunk by chunk, then write the
    dataset from every chunk; returns what this run did (`answer_tokens`, the
    `seconds` spent answering, `done`)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from backends.chat_template import end_of_turn
    from specgate.draft.features import load_target

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    end = end_of_turn(tokenizer)
    done = {str(line["id"]) for line in chunk_lines(out)}
    todo = []
    for prompt in read_prompts(prompt_files):
        ids = tokenizer.apply_chat_template(prompt.as_messages(), add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        if len(ids) <= max_prompt_tokens and prompt.id not in done:
            todo.append((prompt, ids))
    todo.sort(key=lambda item: len(item[1]))  # similar lengths share a batch: less padding
    model = load_target(model_dir, device) if todo else None
    answer_tokens, answering = 0, time.monotonic()
    bar = tqdm(total=len(done) + len(todo), initial=len(done), desc="answers", unit="prompt", disable=not progress)
    for start in range(0, len(todo), chunk_size):
        if time_limit_s is not None and time.monotonic() - started > time_limit_s:
            break
        lines: list[dict[str, Any]] = []
        chunk = todo[start : start + chunk_size]
        for first in range(0, len(chunk), batch_size):
            batch = chunk[first : first + batch_size]
            for (prompt, ids), answer in zip(batch, answer_batch(model, [i for _, i in batch],
                                                                 max_new_tokens, end), strict=True):
                answer_tokens += len(answer)
                lines.append(Record(prompt.id, prompt.traffic_class, ids + answer, [0] * len(ids) + [1] * len(answer),
                                    prompt.source).to_json() if answer else {"id": prompt.id, "empty": True})
            bar.update(len(batch))
        _write_chunk(out, lines)
    bar.close()
    seconds = time.monotonic() - answering
    manifest = assemble(out, model_dir.name)
    return {"manifest": manifest, "answer_tokens": answer_tokens, "seconds": round(seconds, 1),
            "done": len(done) + len(todo) == len({str(line["id"]) for line in chunk_lines(out)})}


def main(argv: list[str] | None = None) -> int:
    from backends.model import prepare

    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--prompts", nargs="+", required=True, type=Path, help="prompts JSONL files")
    parser.add_argument("--out", required=True, type=Path, help="dataset directory to write (and resume)")
    parser.add_argument("--model", type=Path, help="target model folder (default: the prepared SmolLM2)")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--chunk-size", type=int, default=64, help="prompts per chunk file (the resume unit)")
    parser.add_argument("--time-limit", type=float, help="start no chunk after this many seconds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="where the target runs: cpu, cuda, cuda:N")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    run = build(args.prompts, args.out, args.model or prepare(), args.max_new_tokens, args.batch_size,
                chunk_size=args.chunk_size, time_limit_s=args.time_limit, progress=not args.no_progress,
                device=args.device)
    rate = run["answer_tokens"] / run["seconds"] if run["seconds"] else 0.0
    print(f"this run: {run['answer_tokens']} answer tokens in {run['seconds']} s ({rate:.1f} tokens/s); "
          f"{'all prompts answered' if run['done'] else 'prompts left: run again to resume'}", file=sys.stderr)
    print(stats.render(stats.of(dataset.read_records(args.out))))
    return 0 if run["done"] else 3


if __name__ == "__main__":
    raise SystemExit(main())
