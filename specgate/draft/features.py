"""Target features for EAGLE-3 training, computed once, offline.

The target runs (float32, CPU, transformers) over every record of a draft
dataset and the features are stored in shards, so training never runs the
target again. A feature directory:

    DIR/features.json            {"format": "specgate-draft-features", "version": 1,
                                  "model": <model directory name>, "layer_ids": [low, mid, high],
                                  "hidden_size", "vocab_size", "records", "tokens",
                                  "shards": ["shard-00000.safetensors", ...]}
    DIR/shard-NNNNN.safetensors  per token, records back to back:
                                   features  [N, 3H] float16: the input of the three
                                             target layers (vLLM's aux hidden states)
                                   input_ids [N] int32
                                   argmax    [N] int32: the target's greedy next token
                                   loss_mask [N] int8: 1 on response tokens
                                 per record: offsets [R+1] int64, holdout [R] int8
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specgate.draft.dataset import Record

FORMAT = "specgate-draft-features"
VERSION = 1
MANIFEST = "features.json"


@dataclass
class FeatureRecord:
    """One conversation's features (tensors over its tokens)."""

    features: torch.Tensor  # [T, 3H]
    input_ids: torch.Tensor  # [T] long
    argmax: torch.Tensor  # [T] long
    loss_mask: torch.Tensor  # [T] bool
    holdout: bool = False


def is_holdout(record_id: str, share: float) -> bool:
    """A stable held-out split by record id (the id is a hash of the prompt)."""
    try:
        bucket = int(record_id[:8], 16) / 0xFFFFFFFF
    except ValueError:
        bucket = (sum(record_id.encode()) % 1000) / 1000
    return bucket < share


def load_target(model_dir: str | os.PathLike[str], device: torch.device | str = "cpu") -> Any:
    """The target in float32 on `device` (the CPU by default), offline, for inference."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    return model.to(device).eval()


def target_features(model: Any, input_ids: list[int], layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused-layer inputs `[T, 3H]` and the greedy next tokens `[T]` of one sequence."""
    ids = torch.tensor([input_ids], dtype=torch.long, device=model.device)
    with torch.inference_mode():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    # hidden_states[i] is the input of layer i, what vLLM collects for aux layer id i
    features = torch.cat([out.hidden_states[i][0] for i in layer_ids], -1)
    return features.float().cpu(), out.logits[0].argmax(-1).cpu()


def _write_shard(path: Path, records: list[FeatureRecord]) -> None:
    from safetensors.torch import save_file

    lengths = torch.tensor([0] + [len(r.input_ids) for r in records])
    save_file({
        "features": torch.cat([r.features for r in records]).to(torch.float16).contiguous(),
        "input_ids": torch.cat([r.input_ids for r in records]).to(torch.int32),
        "argmax": torch.cat([r.argmax for r in records]).to(torch.int32),
        "loss_mask": torch.cat([r.loss_mask for r in records]).to(torch.int8),
        "offsets": lengths.cumsum(0),
        "holdout": torch.tensor([r.holdout for r in records], dtype=torch.int8),
    }, str(path))  # fmt: skip


def extract(model: Any, records: Iterable[Record], out: str | os.PathLike[str], *, layer_ids: tuple[int, ...],
            model_name: str, holdout_share: float = 0.1, max_tokens: int = 1024,
            shard_records: int = 64, progress: bool = True) -> dict[str, Any]:
    """Run `model` over `records` and write the feature directory `out`."""
    from tqdm import tqdm

    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config
    shards: list[str] = []
    pending: list[FeatureRecord] = []
    count = tokens = 0
    for record in tqdm(records, desc="features", unit="record", disable=not progress):
        ids = record.input_ids[:max_tokens]
        mask = record.loss_mask[: len(ids)]
        if sum(mask[1:]) == 0:
            continue
        features, argmax = target_features(model, ids, layer_ids)
        pending.append(FeatureRecord(features, torch.tensor(ids), argmax, torch.tensor(mask, dtype=torch.bool),
                                     is_holdout(record.id, holdout_share)))  # fmt: skip
        count, tokens = count + 1, tokens + len(ids)
        if len(pending) >= shard_records:
            shards.append(f"shard-{len(shards):05d}.safetensors")
            _write_shard(directory / shards[-1], pending)
            pending = []
    if pending:
        shards.append(f"shard-{len(shards):05d}.safetensors")
        _write_shard(directory / shards[-1], pending)
    manifest = {
        "format": FORMAT, "version": VERSION, "model": model_name, "layer_ids": list(layer_ids),
        "hidden_size": int(config.hidden_size), "vocab_size": int(config.vocab_size),
        "records": count, "tokens": tokens, "shards": shards,
    }  # fmt: skip
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no features ({MANIFEST} missing)")
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} v{VERSION} manifest")
    return manifest


def read_features(directory: str | os.PathLike[str]) -> Iterator[FeatureRecord]:
    """Every record of a feature directory, features in float32."""
    from safetensors.torch import load_file

    for shard in read_manifest(directory)["shards"]:
        tensors = load_file(str(Path(directory) / shard))
        offsets = tensors["offsets"].tolist()
        for index, (start, end) in enumerate(zip(offsets, offsets[1:], strict=False)):
            yield FeatureRecord(
                tensors["features"][start:end].float(), tensors["input_ids"][start:end].long(),
                tensors["argmax"][start:end].long(), tensors["loss_mask"][start:end].bool(),
                bool(tensors["holdout"][index]),
            )  # fmt: skip
