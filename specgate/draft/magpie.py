"""Prompts written by the target itself: the chat template's opening of a user
turn, continued by sampling (the Magpie method).

An instruction-tuned model has seen many user turns in its chat training. Given
only what its template puts before a user's words, and sampled, it writes a
user's request of the kinds that training held: open chat, questions, tasks,
in the user's own voice. None of it comes from a template or file of this
project, so it is a source independent of `specgate.draft.corpus`.

    python -m specgate.draft.magpie --out PROMPTS/magpie.jsonl --count 3000 --device cuda

A sampled turn is kept when it ends (the token the template writes after a
user's text, within `--max-new-tokens`), is 16 to 2,000 characters long, holds no template
marker, and is not a repeat (case and spacing ignored), of this run or of the
files `--exclude` names (another seed's turns, so that a held-out seed shares
none with training). Rows have the shape
of `python -m specgate.draft.corpus.build`'s, with `"source": "magpie"`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from backends.chat_template import end_of_turn, opening
from specgate.draft import prompts

SOURCE = "magpie"
MIN_CHARS, MAX_CHARS = 16, 2000
KINDS = (("code/greedy", re.compile(r"\b(code|function|python|javascript|java|sql|program|script|bug|regex|"
                                     r"class|api|html|css)\b", re.IGNORECASE)),
         ("math/greedy", re.compile(r"\b(calculate|solve|equation|sum|probability|integral|percent|"
                                     r"how many|how much)\b|\d+\s*[-+*/x^]\s*\d+", re.IGNORECASE)),
         ("summarization/greedy", re.compile(r"\b(summari[sz]e|summary|tl;?dr|in short)\b", re.IGNORECASE)))


def traffic_class(text: str) -> str:
    """A coarse class by words in the request (code, maths, summaries; else chat)."""
    return next((name for name, pattern in KINDS if pattern.search(text)), "chat/greedy")


def usable(text: str, ended: bool, markers: tuple[str, ...]) -> bool:
    return ended and MIN_CHARS <= len(text) <= MAX_CHARS and not any(m in text for m in markers)


def turn_key(text: str) -> str:
    """What makes two turns the same one: case and spacing ignored."""
    return " ".join(text.lower().split())


def known_turns(paths: list[Path]) -> set[str]:
    """The keys of the user's last turn of every usable prompt of these prompts
    JSONL files (read as every prompts file is: a line that is not one is skipped)."""
    return {turn_key(prompt.messages[-1][1]) for prompt in prompts.read(paths) if prompt is not None}


def sample(model: Any, tokenizer: Any, count: int, batch_size: int = 64, max_new_tokens: int = 128,
           temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, progress: bool = True,
           time_limit_s: float | None = None, exclude: set[str] | None = None) -> Iterator[str]:
    """Up to `count` distinct user turns, none of them one of `exclude` (keys of
    `turn_key`); gives up after 4x `count` draws, and draws no batch past
    `time_limit_s` seconds."""
    import time

    import torch
    from tqdm import tqdm

    start = opening(tokenizer)
    end = end_of_turn(tokenizer, "user")
    markers = tuple(str(t) for t in tokenizer.all_special_tokens if t) + ("<|im_start|>", "<|im_end|>")
    torch.manual_seed(seed)
    seen: set[str] = set()
    excluded = exclude or set()
    drawn, started = 0, time.monotonic()
    with tqdm(total=count, desc="magpie", unit="prompt", disable=not progress) as bar:
        while len(seen) < count and drawn < 4 * count:
            if time_limit_s is not None and time.monotonic() - started >= time_limit_s:
                break
            ids = torch.tensor([start] * batch_size, device=model.device)
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                     temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                     eos_token_id=end, pad_token_id=end)  # fmt: skip
            drawn += batch_size
            for row in out[:, len(start):].tolist():
                ended = end in row
                text = tokenizer.decode(row[: row.index(end)] if ended else row, skip_special_tokens=False).strip()
                key = turn_key(text)
                if usable(text, ended, markers) and key not in seen and key not in excluded and len(seen) < count:
                    seen.add(key)
                    bar.update(1)
                    yield text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the prompts JSONL to write")
    parser.add_argument("--count", type=int, default=3000, help="distinct prompts wanted (default: %(default)s)")
    parser.add_argument("--model", type=Path, help="target model folder (default: the prepared SmolLM2)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="the longest user turn sampled")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the target runs: cpu, cuda, cuda:N")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="draw no batch after this many seconds of sampling; keeps what it has")
    parser.add_argument("--exclude", nargs="+", type=Path, default=[], metavar="PROMPTS",
                        help="prompts JSONL files whose turns are not written again (another seed's, say, so a "
                             "held-out seed shares no turn with training)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if min(args.count, args.batch_size, args.max_new_tokens) < 1:
        raise SystemExit("--count, --batch-size and --max-new-tokens must be positive")
    if args.time_limit is not None and not args.time_limit > 0:
        raise SystemExit("--time-limit must be a positive number of seconds")
    if missing := [str(path) for path in args.exclude if not path.is_file()]:
        raise SystemExit(f"--exclude: no such file: {', '.join(missing)}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    from backends.model import prepare
    from specgate.draft.features import load_target

    model_dir = args.model or prepare()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = load_target(model_dir, args.device)
    rows = [{"class": traffic_class(text), "source": SOURCE, "messages": [{"role": "user", "content": text}]}
            for text in sample(model, tokenizer, args.count, args.batch_size, args.max_new_tokens, args.temperature,
                               args.top_p, args.seed, progress=not args.no_progress,
                               time_limit_s=args.time_limit, exclude=known_turns(args.exclude))]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    staging = args.out.with_name(f".{args.out.name}.tmp")
    staging.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    staging.replace(args.out)
    print(f"{len(rows)} prompts -> {args.out}", file=sys.stderr)
    return 0 if rows else 3


if __name__ == "__main__":
    raise SystemExit(main())
