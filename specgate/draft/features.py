"""Target features for EAGLE-3 training, computed once, offline.

The target runs (float32, transformers, on the CPU or a GPU) over every
record of a draft dataset, in batches of records of similar length, and the
features are stored in shards, so training never runs the target again. A
feature directory:

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

    features: torch.Tensor  # [T, 3H], float16 as stored (a batch widens it)
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


def target_features(model: Any, sequences: list[list[int]],
                    layer_ids: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each sequence's fused-layer inputs `[T, 3H]` (float16, the stored dtype)
    and greedy next tokens `[T]`, run as one batch padded on the right: in a
    causal model a token's outputs never read the padding after it."""
    length = max(len(ids) for ids in sequences)
    ids = torch.zeros(len(sequences), length, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
        attention[row, : len(sequence)] = 1
    with torch.inference_mode():
        out = model(input_ids=ids.to(model.device), attention_mask=attention.to(model.device),
                    output_hidden_states=True, use_cache=False)
    # hidden_states[i] is the input of layer i, what vLLM collects for aux layer id i
    fused = torch.cat([out.hidden_states[i] for i in layer_ids], -1).to(torch.float16).cpu()
    argmax = out.logits.argmax(-1).cpu()
    return [(fused[row, : len(s)], argmax[row, : len(s)]) for row, s in enumerate(sequences)]


def length_batches(lengths: list[int], budget: int) -> Iterator[list[int]]:
    """Indices of `lengths` shortest first, in batches of at most `budget`
    padded tokens (at least one sequence each), so little of a batch is padding."""
    batch: list[int] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        if batch and (len(batch) + 1) * lengths[index] > budget:
            yield batch
            batch = []
        batch.append(index)
    if batch:
        yield batch


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


def _featured(model: Any, records: list[Record], layer_ids: tuple[int, ...], holdout_share: float,
              max_tokens: int, batch_tokens: int) -> Iterator[FeatureRecord]:
    """`records` run through the target in length-sorted batches, yielded in
    their own order; a record with no answer token after its first is left out."""
    kept = [(r, r.input_ids[:max_tokens]) for r in records if sum(r.loss_mask[1 : max_tokens]) > 0]
    done: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(kept)
    for batch in length_batches([len(ids) for _, ids in kept], batch_tokens):
        for index, result in zip(batch, target_features(model, [kept[i][1] for i in batch], layer_ids),
                                 strict=True):  # fmt: skip
            done[index] = result
    for (record, ids), result in zip(kept, done, strict=True):
        assert result is not None
        yield FeatureRecord(result[0], torch.tensor(ids), result[1],
                            torch.tensor(record.loss_mask[: len(ids)], dtype=torch.bool),
                            is_holdout(record.id, holdout_share))  # fmt: skip


def extract(model: Any, records: Iterable[Record], out: str | os.PathLike[str], *, layer_ids: tuple[int, ...],
            model_name: str, holdout_share: float = 0.1, max_tokens: int = 1024, batch_tokens: int = 8192,
            shard_records: int = 64, progress: bool = True) -> dict[str, Any]:
    """Run `model` over `records` and write the feature directory `out`. The
    records go through the target in batches of at most `batch_tokens` padded
    tokens, sorted by length within a window of shards; the shards keep the
    records' order."""
    from tqdm import tqdm

    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config
    shards: list[str] = []
    pending: list[FeatureRecord] = []
    count = tokens = 0
    window = 16 * shard_records
    bar = tqdm(desc="features", unit="record", disable=not progress)
    for group in _windows(records, window):
        for record in _featured(model, group, layer_ids, holdout_share, max_tokens, batch_tokens):
            pending.append(record)
            count, tokens = count + 1, tokens + len(record.input_ids)
            if len(pending) >= shard_records:
                shards.append(f"shard-{len(shards):05d}.safetensors")
                _write_shard(directory / shards[-1], pending)
                pending = []
        bar.update(len(group))
    bar.close()
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


def _windows(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    group: list[Record] = []
    for record in records:
        group.append(record)
        if len(group) >= size:
            yield group
            group = []
    if group:
        yield group


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no features ({MANIFEST} missing)")
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} v{VERSION} manifest")
    return manifest


def read_features(directory: str | os.PathLike[str], device: torch.device | str = "cpu") -> Iterator[FeatureRecord]:
    """Every record of a feature directory, features in float16 as stored,
    each shard loaded straight onto `device` (records are views of it)."""
    from safetensors.torch import load_file

    for shard in read_manifest(directory)["shards"]:
        tensors = load_file(str(Path(directory) / shard), device=str(device))
        offsets = tensors["offsets"].tolist()
        holdout = tensors["holdout"].tolist()
        input_ids, argmax = tensors["input_ids"].long(), tensors["argmax"].long()
        loss_mask = tensors["loss_mask"].bool()
        for index, (start, end) in enumerate(zip(offsets, offsets[1:], strict=False)):
            yield FeatureRecord(tensors["features"][start:end], input_ids[start:end], argmax[start:end],
                                loss_mask[start:end], bool(holdout[index]))  # fmt: skip
