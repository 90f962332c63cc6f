"""The options of training an EAGLE-3 head (`specgate draft train`); the training is
`specgate.draft.trainer`."""

from __future__ import annotations

from dataclasses import dataclass


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
    eval_every: int = 50  # steps between validations (and resumable checkpoints)
    patience: int = 4  # validations without a lower validation loss before training stops
    validation_tokens: int = 32768  # held-out tokens scored at each validation (all of them at the end)
    max_records: int | None = None  # use at most this many training and held-out records (a dry run)
    device: str = "auto"  # "cpu", "cuda", "cuda:N", or "auto": cuda when torch sees one
