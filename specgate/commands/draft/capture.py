"""Export the prompts the gateway captured to a prompts JSONL for `specgate draft data`.

Reads the capture files (`capture-*.jsonl`) of the directory named in the
policy's `capture` section, oldest first; keeps each distinct conversation
once (its first occurrence), optionally only some traffic classes. The files
hold prompts already scrubbed of PII and secrets by the gateway.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specgate.draft import prompts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, required=True,
                        help="the capture directory (the policy's capture.directory)")
    parser.add_argument("--out", type=Path, required=True, help="the prompts JSONL to write")
    parser.add_argument("--class", dest="classes", action="append", default=[], metavar="CLASS",
                        help="keep only this traffic class, e.g. chat/low (repeatable; default: all)")
    parser.add_argument("--max-chars", type=int, help="drop conversations longer than this many characters")
    parser.add_argument("--limit", type=int, help="keep at most this many prompts")


def run(args: argparse.Namespace) -> int:
    files = sorted(args.dir.glob("capture-*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no capture-*.jsonl files in {args.dir}")
    chosen = prompts.select(prompts.read(files), frozenset(args.classes), args.max_chars, args.limit)
    written = prompts.write(args.out, chosen.kept)
    print(f"{written} prompts to {args.out} from {len(files)} files ({chosen.duplicates} duplicates, "
          f"{chosen.filtered} filtered, {chosen.unusable} unusable)", file=sys.stderr)
    return 0
