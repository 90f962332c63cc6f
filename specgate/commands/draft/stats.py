"""Print the statistics of a draft dataset: records, tokens, answer tokens, per class and per source, lengths.

Reads a dataset directory written by `specgate draft data` (or the in-process
`python -m specgate.draft.ship`); `--json` prints the same numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specgate.draft import dataset, stats


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", type=Path, help="a draft dataset directory")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    numbers = stats.of(dataset.read_records(args.data))
    print(json.dumps(numbers, indent=1) if args.json else stats.render(numbers))
    return 0
