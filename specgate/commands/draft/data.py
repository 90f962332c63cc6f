"""Answer prompts with the target, render them with its chat template, tokenize, mask the answers.

Reads prompts JSONL files (from `specgate draft capture`, or any file of the
same shape), keeps each distinct conversation once, lets the target answer
each one through an OpenAI-compatible URL (the standard pool), and writes the
dataset that draft training reads (format: specgate/draft/dataset.py) to
`--out`. A rerun with the same `--out` asks only the prompts not yet answered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from specgate.draft import dataset, prompts, stats
from specgate.draft.data import build, tokenizer_of
from specgate.draft.regenerate import Asking, answered, regenerate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=Path, action="append", required=True,
                        help="a prompts JSONL (repeatable)")
    parser.add_argument("--url", required=True, help="OpenAI-compatible base URL of the target, e.g. "
                        "http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True, help="the model name the URL serves")
    parser.add_argument("--out", type=Path, required=True, help="the dataset directory to write (and resume)")
    parser.add_argument("--model-dir", type=Path,
                        help="the target's tokenizer and chat template (default: the packaged SmolLM2)")
    parser.add_argument("--class", dest="classes", action="append", default=[], metavar="CLASS",
                        help="keep only this traffic class (repeatable; default: all)")
    parser.add_argument("--max-prompt-chars", type=int, default=8000, help="drop longer conversations")
    parser.add_argument("--limit", type=int, help="use at most this many prompts")
    parser.add_argument("--max-tokens", type=int, default=512, help="the longest answer asked for")
    parser.add_argument("--max-length", type=int, default=2048, help="truncate a record to this many tokens")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--retries", type=int, default=4, help="retries per prompt, with exponential backoff")
    parser.add_argument("--backoff", type=float, default=0.5, help="the first retry's wait in seconds")
    parser.add_argument("--api-key", default=os.environ.get("SPECGATE_DRAFT_API_KEY"),
                        help="bearer key for the URL (default: $SPECGATE_DRAFT_API_KEY)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    chosen = prompts.select(prompts.read(args.prompts), frozenset(args.classes), args.max_prompt_chars, args.limit)
    if not chosen.kept:
        raise ValueError("no usable prompts (a prompt is a conversation that ends with a user turn)")
    asking = Asking(args.url, args.model, args.max_tokens, args.temperature, args.concurrency, args.retries,
                    args.backoff, api_key=args.api_key)
    answers_path = args.out / dataset.ANSWERS
    with tqdm(total=len(chosen.kept), desc="answering", unit="prompt", disable=args.no_progress) as bar:
        tally = asyncio.run(regenerate(chosen.kept, asking, answers_path, progress=bar))
    print(f"{len(chosen.kept)} prompts ({chosen.duplicates} duplicates, {chosen.filtered} filtered, "
          f"{chosen.unusable} unusable): {tally.answered} answered, {tally.skipped} answered before, "
          f"{tally.failed} failed, {tally.retried} retries", file=sys.stderr)
    manifest = build(chosen.kept, answered(answers_path), args.out, tokenizer_of(args.model_dir), args.max_length,
                     progress=not args.no_progress)
    print(f"{manifest['records']} records, {manifest['tokens']} tokens ({manifest['masked_tokens']} in the loss) "
          f"in {args.out}", file=sys.stderr)
    print(stats.render(stats.of(dataset.read_records(args.out))))
    return 0 if tally.failed == 0 else 1
