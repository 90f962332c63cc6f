"""Check that a draft model's tokenizer is interchangeable with the target's.

What is compared, and why it matters: `backends.vllm.check_draft`.
"""

from __future__ import annotations

import argparse

from backends.vllm.check_draft import SAMPLES, differences, load_tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="target model folder, or 'default'")
    parser.add_argument("draft", help="draft model folder, or 'default'")


def run(args: argparse.Namespace) -> int:
    found = differences(load_tokenizer(args.target), load_tokenizer(args.draft))
    if found:
        print(f"incompatible: {args.draft} cannot draft for {args.target}")
        for line in found:
            print(f"  - {line}")
        return 1
    print(f"compatible: vocabulary, special tokens and {len(SAMPLES)} sample encodings match")
    return 0
