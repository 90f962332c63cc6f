"""Held-out acceptance of EAGLE-3 heads on the same dataset, per prompt class.

Scores each head (a directory; `shipped` means the head shipped for the
packaged SmolLM2-135M-Instruct) with `specgate.draft.evaluate.acceptance` on
a draft dataset that none of them trained on: greedy, a draft starting after
every answer token, position k accepted when draft tokens 1..k all equal the
target's greedy tokens. With `--decoded`, only the drafts a chain decoder
would start count: after each draft's accepted tokens and the target's own,
not after every token (what a server's acceptance counts). The target's
features are computed once (or read from `--features`, as `specgate draft
train` writes them).

    python -m bench.draft_heldout --data DATA/heldout --heads shipped HEAD [--features DIR] [--depth 3] [--decoded]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from backends.engine.eagle3 import checkpoint
from specgate.draft import dataset, evaluate, features
from specgate.draft.train import TrainOptions
from specgate.draft.trainer import ensure_features, fixed_batches, target_weights


def classes_of(data: Path) -> list[str]:
    """Each record's class, in the order the features hold them."""
    return [record.traffic_class or "-" for record in dataset.read_records(data)]


def score(heads: list[str], data: Path, feature_dir: Path, model_dir: Path, depth: int,
          decoded: bool = False) -> dict[str, Any]:
    ensure_features(data, feature_dir, model_dir, TrainOptions(holdout=0.0), progress=False)
    records = list(features.read_features(feature_dir))
    classes = classes_of(data)
    groups = {"all": records}
    if len(classes) == len(records):  # every record kept (none lacked an answer token after the first)
        for name in sorted(set(classes)):
            groups[name] = [r for r, c in zip(records, classes, strict=True) if c == name]
    embedding = target_weights(model_dir)["embed"]
    out: dict[str, Any] = {}
    for name in heads:
        head = checkpoint.load(checkpoint.shipped_head_path() if name == "shipped" else name, embedding=embedding)
        out[name] = {group: evaluate.acceptance(head, fixed_batches(rows, 2048), depth, decoded)
                     for group, rows in groups.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    from backends.model import prepare

    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a draft dataset no head trained on")
    parser.add_argument("--heads", nargs="+", required=True, help="head directories, or `shipped`")
    parser.add_argument("--features", type=Path, help="feature directory to reuse or fill (default: DATA/features)")
    parser.add_argument("--model", type=Path, help="the target's folder (default: the packaged SmolLM2)")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--decoded", action="store_true",
                        help="count only the drafts a chain decoder would start (after each accepted run)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    scores = score(args.heads, args.data, args.features or args.data / "features", args.model or prepare(),
                   args.depth, args.decoded)
    print(f"{'head':<40} {'class':<22} {'drafts':>7}  acceptance per position    mean accepted length")
    for head, groups in scores.items():
        for group, held in groups.items():
            print(f"{head[-40:]:<40} {group:<22} {held['drafts']:>7}  "
                  f"{' / '.join(f'{a:.3f}' for a in held['acceptance_per_position']):<26} "
                  f"{held['mean_accepted_length']:.2f}")
    if args.out:
        args.out.write_text(json.dumps(scores, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
