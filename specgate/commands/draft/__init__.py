"""Build a draft head from your own traffic: capture, data, train.

Each subcommand is a module with `add_arguments(parser)` and `run(args) -> int`,
like the top-level commands; heavy imports stay inside `run`.
"""

from __future__ import annotations

import argparse
import importlib

# (name, module, one-line help)
SUBCOMMANDS: tuple[tuple[str, str, str], ...] = (
    ("capture", "specgate.commands.draft.capture", "export captured prompts (deduplicated) to a prompts JSONL"),
    ("data", "specgate.commands.draft.data", "answer prompts with the target, tokenize with its chat template, mask"),
    ("stats", "specgate.commands.draft.stats", "print a draft dataset's statistics per class and source"),
    ("train", "specgate.commands.draft.train", "train an EAGLE-3 head on a draft dataset, evaluate it held out"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="draft_command", metavar="SUBCOMMAND", required=True)
    for name, module_name, help_text in SUBCOMMANDS:
        module = importlib.import_module(module_name)
        child = sub.add_parser(name, help=help_text,
                               description=(module.__doc__ or help_text).strip().splitlines()[0])
        module.add_arguments(child)
        child.set_defaults(draft_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args.draft_run(args) or 0)
