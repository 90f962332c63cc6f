"""`specgate draft train`: an EAGLE-3 head from a draft dataset.

1. Features: the target runs once over the dataset (`specgate.draft.features`);
   a feature directory that already holds them is reused.
2. Draft vocabulary: the most frequent target tokens of the training split's
   responses (`--draft-vocab`); the lm head starts from the target's rows.
3. Training: training-time test over `--ttt-steps` draft steps (later steps
   read the head's own hidden state), loss masked to response tokens.
4. Output directory: the checkpoint (config.json, model.safetensors, which vLLM
   and the bundled engine load), training.json, eval.json (held-out acceptance
   per position), loss.png and accuracy.png.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from backends.engine.eagle3 import checkpoint
from backends.engine.eagle3.head import Eagle3Head, HeadConfig
from specgate.draft import evaluate, features
from specgate.draft.evaluate import Batch


@dataclass(frozen=True)
class TrainOptions:
    steps: int = 300
    ttt_steps: int = 3
    draft_vocab: int = 4096
    lr: float = 2e-3
    batch_tokens: int = 2048
    seed: int = 0
    holdout: float = 0.1
    max_tokens: int = 1024
    save_dtype: str = "bfloat16"


def draft_vocabulary(records: list[features.FeatureRecord], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` target ids the responses use most (the target's greedy
    tokens on response positions), ties broken by id; sorted by id."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for record in records:
        mask = record.loss_mask[1:]
        counts += torch.bincount(record.argmax[:-1][mask], minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


def make_batch(records: list[features.FeatureRecord]) -> Batch:
    length = max(len(r.input_ids) for r in records)
    width = records[0].features.shape[1]
    batch = Batch(torch.zeros(len(records), length, width), torch.zeros(len(records), length, dtype=torch.long),
                  torch.zeros(len(records), length, dtype=torch.long),
                  torch.zeros(len(records), length, dtype=torch.bool))  # fmt: skip
    for row, record in enumerate(records):
        n = len(record.input_ids)
        batch.features[row, :n] = record.features
        batch.input_ids[row, :n] = record.input_ids
        batch.argmax[row, :n] = record.argmax
        batch.loss_mask[row, :n] = record.loss_mask
    return batch


def sample_batch(records: list[features.FeatureRecord], budget: int, generator: torch.Generator) -> Batch:
    """Random records (seeded) up to about `budget` tokens, at least one."""
    chosen: list[features.FeatureRecord] = []
    tokens = 0
    while not chosen or tokens < budget:
        record = records[int(torch.randint(len(records), (1,), generator=generator))]
        if chosen and tokens + len(record.input_ids) > budget:
            break
        chosen.append(record)
        tokens += len(record.input_ids)
    return make_batch(chosen)


def fixed_batches(records: list[features.FeatureRecord], budget: int) -> list[Batch]:
    batches, current, tokens = [], [], 0
    for record in records:
        if current and tokens + len(record.input_ids) > budget:
            batches.append(make_batch(current))
            current, tokens = [], 0
        current.append(record)
        tokens += len(record.input_ids)
    return batches + ([make_batch(current)] if current else [])


def target_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """The target's token embedding, output head and final norm."""
    from safetensors import safe_open

    wanted = {"model.embed_tokens.weight": "embed", "lm_head.weight": "lm_head", "model.norm.weight": "norm"}
    found: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118  (a safetensors handle is not a dict)
                if name in wanted:
                    found[wanted[name]] = weights.get_tensor(name).float()
    if "embed" not in found:
        raise ValueError(f"{model_dir}: no model.embed_tokens.weight in its safetensors files")
    found.setdefault("lm_head", found["embed"])  # tied embeddings
    return found


def new_head(model_dir: Path, manifest: dict[str, Any], vocab: torch.Tensor, seed: int) -> Eagle3Head:
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    ids = manifest["layer_ids"]
    config = HeadConfig.from_target(target, len(vocab), (int(ids[0]), int(ids[1]), int(ids[2])))
    torch.manual_seed(seed)
    head = Eagle3Head(config)
    weights = target_weights(model_dir)
    head.load_embedding(weights["embed"])
    head.set_draft_vocab(vocab)
    with torch.no_grad():  # start from the target's own output layer, restricted to the draft vocabulary
        head.lm_head.weight.copy_(weights["lm_head"][vocab])
        if "norm" in weights:
            head.norm.weight.copy_(weights["norm"])
    return head


def _learning_rate(step: int, options: TrainOptions) -> float:
    warmup = max(1, options.steps // 20)
    if step < warmup:
        return options.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, options.steps - warmup)
    return options.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def fit(head: Eagle3Head, train: list[features.FeatureRecord], options: TrainOptions,
        progress: bool = True) -> list[dict[str, Any]]:
    """Train `head` in place; returns the loss and per-position accuracy of every step."""
    from tqdm import tqdm

    generator = torch.Generator().manual_seed(options.seed)
    torch.manual_seed(options.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=options.lr, betas=(0.9, 0.95), weight_decay=0.0)
    history: list[dict[str, Any]] = []
    head.train()
    bar = tqdm(range(options.steps), desc="train", unit="step", disable=not progress)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, options)
        result = evaluate.run_steps(head, sample_batch(train, options.batch_tokens, generator), options.ttt_steps)
        optimizer.zero_grad()
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        optimizer.step()
        accuracy = [c / n if n else 0.0 for c, n in zip(result.correct, result.counted, strict=True)]
        loss = float(result.loss.detach())
        history.append({"step": step + 1, "loss": round(loss, 5), "accuracy": [round(a, 4) for a in accuracy]})
        bar.set_postfix(loss=f"{loss:.3f}", acc0=f"{accuracy[0]:.2f}")
    head.eval()
    return history


def ensure_features(data: Path, feature_dir: Path, model_dir: Path, options: TrainOptions,
                    progress: bool) -> dict[str, Any]:
    """The feature directory for `data`, computed with the target unless already there."""
    if (feature_dir / features.MANIFEST).is_file():
        return features.read_manifest(feature_dir)
    from backends.engine.eagle3.head import default_layer_ids
    from specgate.draft.dataset import read_records

    model = features.load_target(model_dir)
    layers = default_layer_ids(int(model.config.num_hidden_layers))
    return features.extract(model, read_records(data), feature_dir, layer_ids=layers,
                            model_name=model_dir.name, holdout_share=options.holdout,
                            max_tokens=options.max_tokens, progress=progress)  # fmt: skip


def train(data: Path, out: Path, model_dir: Path, options: TrainOptions, feature_dir: Path | None = None,
          progress: bool = True, held_out_data: Path | None = None) -> dict[str, Any]:
    """The whole run; returns what training.json holds. With `held_out_data`
    (a second dataset), all of `data` trains and that one is evaluated;
    otherwise a `--holdout` share of `data` is kept apart by record id."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    feature_dir = feature_dir or out / "features"
    manifest = ensure_features(data, feature_dir, model_dir, options, progress)
    records = list(features.read_features(feature_dir))
    if held_out_data is None:
        train_set = [r for r in records if not r.holdout]
        held_out = [r for r in records if r.holdout]
    else:
        ensure_features(held_out_data, out / "features-held-out", model_dir, options, progress)
        train_set, held_out = records, list(features.read_features(out / "features-held-out"))
    featured = time.monotonic()
    if not train_set or not held_out:
        raise ValueError(f"{len(train_set)} training and {len(held_out)} held-out records: need both "
                         "(more prompts, or another --holdout share)")  # fmt: skip
    vocab = draft_vocabulary(train_set, min(options.draft_vocab, manifest["vocab_size"]), manifest["vocab_size"])
    head = new_head(model_dir, manifest, vocab, options.seed)
    history = fit(head, train_set, options, progress)
    trained = time.monotonic()
    held = evaluate.acceptance(head, fixed_batches(held_out, options.batch_tokens), options.ttt_steps)
    checkpoint.save(head, out, verifier=model_dir.name, speculative_tokens=options.ttt_steps,
                    dtype=getattr(torch, options.save_dtype))  # fmt: skip
    evaluate.write_json(out / "eval.json", held)
    evaluate.plot_history(history, held, out)
    summary = {
        "options": asdict(options), "model": model_dir.name, "features": manifest,
        "train_records": len(train_set), "held_out_records": len(held_out),
        "train_tokens": sum(len(r.input_ids) for r in train_set),
        "seconds": {"features": round(featured - started, 1), "training": round(trained - featured, 1)},
        "held_out": held, "history": history,
    }  # fmt: skip
    evaluate.write_json(out / "training.json", summary)
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainOptions()
    parser.add_argument("--data", required=True, help="dataset directory written by `specgate draft data`")
    parser.add_argument("--out", required=True, help="output directory: the head, eval.json, plots")
    parser.add_argument("--model", help="target model folder (default: the prepared SmolLM2-135M-Instruct)")
    parser.add_argument("--features", help="feature directory to reuse or fill (default: OUT/features)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--ttt-steps", type=int, default=defaults.ttt_steps, help="draft steps trained")
    parser.add_argument("--draft-vocab", type=int, default=defaults.draft_vocab, help="draft vocabulary size")
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--batch-tokens", type=int, default=defaults.batch_tokens)
    parser.add_argument("--holdout", type=float, default=defaults.holdout, help="held-out share of records")
    parser.add_argument("--held-out-data", help="a second dataset to evaluate on (then all of --data trains)")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="per record")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from backends.model import prepare

    options = TrainOptions(steps=args.steps, ttt_steps=args.ttt_steps, draft_vocab=args.draft_vocab, lr=args.lr,
                           batch_tokens=args.batch_tokens, seed=args.seed, holdout=args.holdout,
                           max_tokens=args.max_tokens)  # fmt: skip
    if min(options.steps, options.ttt_steps, options.draft_vocab, options.batch_tokens) < 1:
        raise SystemExit("--steps, --ttt-steps, --draft-vocab and --batch-tokens must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = Path(args.model).expanduser() if args.model else prepare()
    summary = train(Path(args.data), Path(args.out), model_dir, options,
                    Path(args.features) if args.features else None, progress=not args.no_progress,
                    held_out_data=Path(args.held_out_data) if args.held_out_data else None)  # fmt: skip
    held = summary["held_out"]
    print(f"held-out acceptance per position {held['acceptance_per_position']}, "
          f"mean accepted length {held['mean_accepted_length']}; head in {os.fspath(args.out)}")  # fmt: skip
    return 0
