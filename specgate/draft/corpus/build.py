"""Write the corpus: one prompts JSONL per source.

    python -m specgate.draft.corpus.build --out prompts/ [--seed 31] [--count templates=1500 ...]

Each source gets its own seeded generator (the seed and the source's name),
so changing one source's count never changes another's prompts. A prompt
that appears in an earlier source is left out of the later ones.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

from specgate.draft.corpus import packages, puzzles, stdlib, templates

Maker = Callable[[random.Random, int], list[dict[str, object]]]
SOURCES: dict[str, Maker] = {"templates": templates.make, "puzzles": puzzles.make, "stdlib": stdlib.make,
                             "packages": packages.make}
COUNTS = {"templates": 1600, "puzzles": 900, "stdlib": 1200, "packages": 400}


def generate(seed: int, counts: dict[str, int]) -> dict[str, list[dict[str, object]]]:
    """Rows per source, distinct across sources."""
    seen: set[str] = set()
    out: dict[str, list[dict[str, object]]] = {}
    for name, make in SOURCES.items():
        rows = []
        for row in make(random.Random(f"{seed}:{name}"), counts.get(name, 0)):
            key = json.dumps(row["messages"], sort_keys=True)
            if key not in seen:
                seen.add(key)
                rows.append(row)
        out[name] = rows
    return out


def _count(text: str) -> tuple[str, int]:
    name, _, number = text.partition("=")
    if name not in SOURCES or not number.isdigit():
        raise argparse.ArgumentTypeError(f"expected SOURCE=N with SOURCE one of {', '.join(SOURCES)}")
    return name, int(number)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for SOURCE.jsonl files")
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--count", type=_count, action="append", default=[], metavar="SOURCE=N",
                        help=f"prompts of a source (defaults: {COUNTS})")
    args = parser.parse_args(argv)
    rows = generate(args.seed, {**COUNTS, **dict(args.count)})
    args.out.mkdir(parents=True, exist_ok=True)
    for name, items in rows.items():
        with (args.out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in items)
        print(f"{len(items)} prompts -> {args.out / f'{name}.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
