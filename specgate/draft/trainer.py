"""The training behind `specgate draft train` (torch): features, draft
vocabulary, the training-time-test loop, the checkpoint and its evaluation.
Imported only when a head is trained, so the CLI starts without torch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from backends.engine.eagle3 import checkpoint
from backends.engine.eagle3.head import Eagle3Head, HeadConfig
from specgate.draft import evaluate, features
from specgate.draft.evaluate import Batch
from specgate.draft.fit import fit
from specgate.draft.train import TrainOptions


def draft_vocabulary(records: list[features.FeatureRecord], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` target ids the responses use most (the target's greedy
    tokens on response positions), ties broken by id; sorted by id."""
    counts = torch.zeros(vocab_size, dtype=torch.long, device=records[0].argmax.device if records else "cpu")
    for record in records:
        mask = record.loss_mask[1:]
        counts += torch.bincount(record.argmax[:-1][mask], minlength=vocab_size)
    counted = counts.tolist()
    order = sorted(range(vocab_size), key=lambda i: (-counted[i], i))
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


def make_batch(records: list[features.FeatureRecord]) -> Batch:
    """The records padded into one batch, features in float32, on the records' device."""
    length = max(len(r.input_ids) for r in records)
    width = records[0].features.shape[1]
    device = records[0].features.device
    batch = Batch(torch.zeros(len(records), length, width, device=device),
                  torch.zeros(len(records), length, dtype=torch.long, device=device),
                  torch.zeros(len(records), length, dtype=torch.long, device=device),
                  torch.zeros(len(records), length, dtype=torch.bool, device=device))  # fmt: skip
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


def resolve_device(name: str) -> torch.device:
    """The training device: `auto` is cuda when torch sees a GPU, else cpu; a
    cuda device that torch cannot see is an error that says so."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch sees no CUDA GPU (torch {torch.__version__}, "
                         f"built for CUDA {torch.version.cuda or 'none'})")
    return device


def ensure_features(data: Path | Sequence[Path], feature_dir: Path, model_dir: Path, options: TrainOptions,
                    progress: bool, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The feature directory for `data` (one dataset, or several read one after
    another), computed with the target unless already there."""
    if (feature_dir / features.MANIFEST).is_file():
        return features.read_manifest(feature_dir)
    from backends.engine.eagle3.head import default_layer_ids
    from specgate.draft.dataset import read_datasets

    model = features.load_target(model_dir, device)
    layers = default_layer_ids(int(model.config.num_hidden_layers))
    return features.extract(model, read_datasets(data), feature_dir, layer_ids=layers,
                            model_name=model_dir.name, holdout_share=options.holdout,
                            max_tokens=options.max_tokens, batch_tokens=options.batch_tokens,
                            progress=progress)  # fmt: skip


Records = list[features.FeatureRecord]


def _split(data: Path | Sequence[Path], out: Path, feature_dir: Path, model_dir: Path, options: TrainOptions,
           progress: bool, held_out_data: Path | None) -> tuple[dict[str, Any], Records, Records]:
    device = resolve_device(options.device)
    manifest = ensure_features(data, feature_dir, model_dir, options, progress, device)
    records = list(features.read_features(feature_dir, device))  # on a GPU, batches are built there
    if held_out_data is None:
        train_set, held_out = [r for r in records if not r.holdout], [r for r in records if r.holdout]
    else:
        ensure_features(held_out_data, out / "features-held-out", model_dir, options, progress, device)
        train_set, held_out = records, list(features.read_features(out / "features-held-out", device))
    if options.max_records is not None:
        train_set, held_out = train_set[: options.max_records], held_out[: options.max_records]
    if not train_set or not held_out:
        raise ValueError(f"{len(train_set)} training and {len(held_out)} held-out records: need both "
                         "(more prompts, or another --holdout share)")  # fmt: skip
    return manifest, train_set, held_out


def train(data: Path | Sequence[Path], out: Path, model_dir: Path, options: TrainOptions,
          feature_dir: Path | None = None, progress: bool = True, held_out_data: Path | None = None,
          stop_after: int | None = None, time_limit_s: float | None = None) -> dict[str, Any]:
    """The whole run; returns what training.json holds. `data` is a dataset
    directory or several, which train together. With `held_out_data`
    (a second dataset), all of `data` trains and that one is validated and
    evaluated; otherwise a `--holdout` share of `data` is kept apart by record
    id. `stop_after` steps end this call early (the run resumes from its
    checkpoint). Past `time_limit_s` seconds (features included) no step
    starts: the head of the best validation so far is written out, and the
    checkpoint still resumes the schedule."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    device = resolve_device(options.device)
    manifest, train_set, held_out = _split(data, out, feature_dir or out / "features", model_dir, options,
                                           progress, held_out_data)
    featured = time.monotonic()
    vocab = draft_vocabulary(train_set, min(options.draft_vocab, manifest["vocab_size"]), manifest["vocab_size"])
    head = new_head(model_dir, manifest, vocab, options.seed).to(device)
    batches = fixed_batches(held_out, options.batch_tokens)
    validation = batches[: max(1, options.validation_tokens // max(1, options.batch_tokens))]
    def sample(generator: torch.Generator) -> Batch:
        return sample_batch(train_set, options.batch_tokens, generator)

    deadline = None if time_limit_s is None else started + time_limit_s
    run = fit(head, sample, validation, options, out, progress, stop_after, deadline)
    summary: dict[str, Any] = {
        "options": asdict(options), "model": model_dir.name, "features": manifest, "device": str(device),
        "train_records": len(train_set), "held_out_records": len(held_out),
        "train_tokens": sum(len(r.input_ids) for r in train_set), "steps_done": run.step,
        "finished": run.stopped_early or run.step >= options.steps, "stopped_early": run.stopped_early,
        "out_of_time": run.out_of_time, "best_step": run.best_step, "validation": run.validation,
        "history": run.history,
    }  # fmt: skip
    if not summary["finished"] and not run.out_of_time:
        return summary  # resumed by the next run with the same options and --out
    trained = time.monotonic()
    held = evaluate.acceptance(head, batches, options.ttt_steps)
    head.to("cpu")
    checkpoint.save(head, out, verifier=model_dir.name, speculative_tokens=options.ttt_steps,
                    dtype=getattr(torch, options.save_dtype))  # fmt: skip
    evaluate.write_json(out / "eval.json", held)
    evaluate.plot_history(run.history, held, out)
    evaluate.plot_validation(run.validation, out)
    summary["held_out"] = held
    summary["seconds"] = {"features": round(featured - started, 1), "training": round(trained - featured, 1)}
    evaluate.write_json(out / "training.json", summary)
    return summary
