"""EAGLE-3 training on a tiny target: features offline, the masked loss,
training-time test, the held-out evaluation and the plots."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from backends.engine.eagle3 import checkpoint
from specgate.draft import evaluate, features
from specgate.draft.dataset import MANIFEST, RECORDS
from specgate.draft.train import TrainOptions
from specgate.draft.trainer import draft_vocabulary, make_batch, new_head, train

pytestmark = pytest.mark.slow  # torch

VOCAB = 64


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 6-layer Llama saved as a model folder."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, intermediate_size=64, vocab_size=VOCAB, tie_word_embeddings=True,
                         max_position_embeddings=256)  # fmt: skip
    folder = tmp_path_factory.mktemp("model")
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def write_dataset(directory: Path, count: int = 40) -> Path:
    """Conversations: a prompt of random tokens (8 to 15 of them), then an
    answer that counts up from a token the prompt names (so it can be learnt)."""
    generator = torch.Generator().manual_seed(1)
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for index in range(count):
        prompt = torch.randint(4, VOCAB, (8 + index % 8,), generator=generator).tolist()
        start = prompt[-1]
        answer = [(start + i) % (VOCAB - 4) + 4 for i in range(20)]
        ids = [1, *prompt, 2, *answer, 3]
        mask = [0] * (len(prompt) + 2) + [1] * (len(answer) + 1)
        record_id = hashlib.sha256(str(index).encode()).hexdigest()[:16]
        lines.append(json.dumps({"id": record_id, "class": "chat", "input_ids": ids, "loss_mask": mask}))
    (directory / RECORDS).write_text("\n".join(lines) + "\n")
    (directory / MANIFEST).write_text(json.dumps({"format": "specgate-draft-dataset", "version": 1,
                                                  "tokenizer": "tiny", "records": count}))  # fmt: skip
    return directory


def test_training_lowers_the_loss_and_writes_the_head_eval_and_plots(tiny_model: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    data = write_dataset(tmp_path / "data")
    options = TrainOptions(steps=40, ttt_steps=2, draft_vocab=48, lr=3e-3, batch_tokens=256, holdout=0.2)
    summary = train(data, tmp_path / "head", tiny_model, options, progress=False)
    losses = [h["loss"] for h in summary["history"]]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert summary["held_out_records"] > 0 and summary["train_records"] > summary["held_out_records"]
    out = tmp_path / "head"
    for name in ("loss.png", "accuracy.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    held = json.loads((out / "eval.json").read_text())
    assert held["drafts"] > 0 and len(held["acceptance_per_position"]) == 2
    assert 0.0 <= held["acceptance_per_position"][1] <= held["acceptance_per_position"][0] <= 1.0
    manifest = features.read_manifest(tmp_path / "head" / "features")
    head = checkpoint.load(out, embedding=torch.zeros(VOCAB, 32))
    assert head.config.layer_ids == tuple(manifest["layer_ids"]) == (2, 3, 3)
    assert head.config.draft_vocab_size == 48
    again = train(data, tmp_path / "again", tiny_model, options, feature_dir=out / "features", progress=False)
    assert again["history"] == summary["history"]  # seeded: the same run twice gives the same steps


def test_the_loss_ignores_the_targets_of_prompt_tokens(tiny_model: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    data = write_dataset(tmp_path / "data", count=6)
    from specgate.draft.dataset import read_records

    model = features.load_target(tiny_model)
    features.extract(model, read_records(data), tmp_path / "f", layer_ids=(2, 3, 3), model_name="tiny",
                     progress=False)  # fmt: skip
    records = list(features.read_features(tmp_path / "f"))
    manifest = features.read_manifest(tmp_path / "f")
    head = new_head(tiny_model, manifest, draft_vocabulary(records, 48, VOCAB), seed=0)
    batch = make_batch(records)

    def loss(argmax: torch.Tensor) -> float:
        changed = evaluate.Batch(batch.features, batch.input_ids, argmax, batch.loss_mask)
        with torch.no_grad():
            return float(evaluate.run_steps(head, changed, steps=3).loss)

    base = loss(batch.argmax)
    prompt_labels = torch.zeros_like(batch.loss_mask)
    prompt_labels[:, :-1] = ~batch.loss_mask[:, 1:]  # argmax[p] is the label of token p+1
    scrambled = torch.where(prompt_labels, (batch.argmax + 7) % VOCAB, batch.argmax)
    assert not torch.equal(scrambled, batch.argmax)
    assert loss(scrambled) == pytest.approx(base, abs=1e-6)
    response_labels = torch.zeros_like(batch.loss_mask)
    response_labels[:, :-1] = batch.loss_mask[:, 1:]
    assert loss(torch.where(response_labels, (batch.argmax + 7) % VOCAB, batch.argmax)) != pytest.approx(base)


def test_batched_features_are_those_of_one_record_at_a_time_in_the_records_order(tiny_model: Path,
                                                                                 tmp_path: Path) -> None:
    torch.set_num_threads(1)
    data = write_dataset(tmp_path / "data", count=24)
    from specgate.draft.dataset import read_records

    model = features.load_target(tiny_model)
    for name, budget in (("alone", 1), ("batched", 256)):
        features.extract(model, read_records(data), tmp_path / name, layer_ids=(2, 3, 3), model_name="tiny",
                         batch_tokens=budget, shard_records=4, progress=False)  # fmt: skip
    alone = list(features.read_features(tmp_path / "alone"))
    batched = list(features.read_features(tmp_path / "batched"))
    assert [r.input_ids.tolist() for r in batched] == [r.input_ids.tolist() for r in alone]
    assert [r.input_ids.tolist() for r in alone] == [r.input_ids for r in read_records(data)]
    assert len({len(r.input_ids) for r in alone}) == 8  # lengths differ, so batches were padded
    for one, many in zip(alone, batched, strict=True):
        assert torch.equal(one.argmax, many.argmax) and torch.equal(one.loss_mask, many.loss_mask)
        assert torch.allclose(one.features.float(), many.features.float(), atol=2e-3)
        assert one.features.dtype == torch.float16


def test_several_datasets_train_together(tiny_model: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    first, second = write_dataset(tmp_path / "first", count=6), write_dataset(tmp_path / "second", count=12)
    held = write_dataset(tmp_path / "held", count=4)
    options = TrainOptions(steps=2, ttt_steps=2, draft_vocab=48, batch_tokens=128)
    summary = train([first, second], tmp_path / "head", tiny_model, options, progress=False, held_out_data=held)
    assert summary["train_records"] == 18 and summary["features"]["records"] == 18


def test_a_second_dataset_is_the_held_out_set(tiny_model: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    data = write_dataset(tmp_path / "data", count=12)
    held = write_dataset(tmp_path / "held", count=4)
    options = TrainOptions(steps=3, ttt_steps=2, draft_vocab=48, batch_tokens=128)
    summary = train(data, tmp_path / "head", tiny_model, options, progress=False, held_out_data=held)
    assert (summary["train_records"], summary["held_out_records"]) == (12, 4)
    assert summary["held_out"]["drafts"] == 4 * 20  # every answer token after the first starts a draft


def uninterrupted(tiny_model: Path, tmp_path: Path, steps: int) -> tuple[Path, TrainOptions, dict, Path]:
    """A run of `steps` on 16 records, validated every 2: its data, options, summary and features."""
    torch.set_num_threads(1)
    data = write_dataset(tmp_path / "data", count=16)
    options = TrainOptions(steps=steps, ttt_steps=2, draft_vocab=48, batch_tokens=128, holdout=0.3, eval_every=2,
                           patience=10, device="cpu")
    whole = train(data, tmp_path / "whole", tiny_model, options, progress=False)
    return data, options, whole, tmp_path / "whole" / "features"


def test_a_stopped_run_resumes_to_the_same_steps_as_an_uninterrupted_one(tiny_model: Path, tmp_path: Path) -> None:
    data, options, whole, features_dir = uninterrupted(tiny_model, tmp_path, steps=6)
    part = train(data, tmp_path / "part", tiny_model, options, feature_dir=features_dir, progress=False, stop_after=3)
    assert (part["finished"], part["steps_done"], len(part["validation"])) == (False, 3, 1)
    assert (tmp_path / "part" / "resume.pt").is_file() and not (tmp_path / "part" / "eval.json").exists()
    rest = train(data, tmp_path / "part", tiny_model, options, feature_dir=features_dir, progress=False)
    assert rest["finished"] and rest["history"] == whole["history"] and rest["validation"] == whole["validation"]
    assert rest["held_out"] == whole["held_out"]
    other = TrainOptions(**{**options.__dict__, "lr": 1e-4})
    with pytest.raises(ValueError, match="other options"):
        train(data, tmp_path / "part", tiny_model, other, feature_dir=features_dir, progress=False)


def test_a_run_out_of_time_writes_its_best_head_and_still_resumes(tiny_model: Path, tmp_path: Path) -> None:
    data, options, whole, features_dir = uninterrupted(tiny_model, tmp_path, steps=4)
    # a limit already spent when training starts: no step runs, the starting head is validated and written
    cut = train(data, tmp_path / "cut", tiny_model, options, feature_dir=features_dir, progress=False,
                time_limit_s=1e-9)
    assert (cut["out_of_time"], cut["finished"], cut["steps_done"], cut["best_step"]) == (True, False, 0, 0)
    assert [v["step"] for v in cut["validation"]] == [0]
    assert (tmp_path / "cut" / "model.safetensors").is_file() and cut["held_out"]["drafts"] > 0
    assert checkpoint.load(tmp_path / "cut", embedding=torch.zeros(VOCAB, 32)).config.draft_vocab_size == 48
    rest = train(data, tmp_path / "cut", tiny_model, options, feature_dir=features_dir, progress=False)
    assert rest["finished"] and not rest["out_of_time"] and rest["history"] == whole["history"]
    assert rest["validation"][1:] == whole["validation"]


def test_training_stops_when_the_held_out_loss_stops_falling(tiny_model: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    data = write_dataset(tmp_path / "data", count=12)
    options = TrainOptions(steps=20, ttt_steps=2, draft_vocab=48, lr=0.0, batch_tokens=128, holdout=0.3,
                           eval_every=1, patience=2, device="cpu")
    summary = train(data, tmp_path / "head", tiny_model, options, progress=False)
    # lr 0: the first validation is the best, the next two are no lower
    assert summary["stopped_early"] and summary["steps_done"] == 3 and summary["best_step"] == 1
    assert [v["step"] for v in summary["validation"]] == [1, 2, 3]
    assert (tmp_path / "head" / "validation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_device_is_cuda_only_where_torch_sees_one() -> None:
    from specgate.draft.trainer import resolve_device

    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA GPU"):
            resolve_device("cuda")


def test_the_command_dry_run_takes_the_device_path_in_two_steps(tiny_model: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from specgate.commands.draft import train as command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    data = write_dataset(tmp_path / "data", count=30)
    args = parser.parse_args(["--data", str(data), "--out", str(tmp_path / "head"), "--model", str(tiny_model),
                              "--draft-vocab", "48", "--batch-tokens", "128", "--holdout", "0.3", "--threads", "1",
                              "--device", "auto", "--dry-run", "--no-progress"])
    assert command.run(args) == 0
    assert "held-out acceptance per position" in capsys.readouterr().out
    summary = json.loads((tmp_path / "head" / "training.json").read_text())
    assert summary["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert summary["steps_done"] == 2 and [v["step"] for v in summary["validation"]] == [1, 2]
    assert summary["train_records"] <= 8 and summary["held_out_records"] <= 8
    assert checkpoint.load(tmp_path / "head", embedding=torch.zeros(VOCAB, 32)).config.draft_vocab_size == 48


def test_a_chaindecoder_starts_drafts_only_past_each_accepted_run() -> None:
    possible = torch.tensor([[True, True, True, True, True, True, False],
                             [False, True, True, True, True, True, True]])
    hits = torch.zeros(2, 2, 7, dtype=torch.bool)  # [depth, B, T]
    hits[:, 0, 0] = True  # row 0: two accepted at 0 -> next draft at 3
    hits[0, 0, 4] = True  # one accepted at 4 -> next at 6, not a start: the row ends
    hits[0, 1, 1] = True  # row 1: one accepted at 1 -> next at 3
    reached = evaluate.decoder_starts(possible, hits, depth=2)
    assert reached[0].nonzero().flatten().tolist() == [0, 3, 4]
    assert reached[1].nonzero().flatten().tolist() == [1, 3, 4, 5, 6]
