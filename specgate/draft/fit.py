"""The training loop of `specgate draft train`: training-time-test steps,
validation on held-out batches, early stopping and a resumable checkpoint.

Every `eval_every` steps the head is scored on the validation batches (loss
and acceptance per position); when the validation loss has not improved for
`patience` such evaluations, training stops and the best head is kept. At
each evaluation the whole state (head, optimizer, the batch sampler's and
torch's random state, the history, the best head so far) is written to
`resume.pt` next to the output, by rename; a run with the same options and
output resumes from it and repeats the steps an uninterrupted run would take.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from backends.engine.eagle3.head import Eagle3Head
from specgate.draft import evaluate
from specgate.draft.evaluate import Batch
from specgate.draft.train import TrainOptions

RESUME = "resume.pt"
RESUMABLE = ("steps", "ttt_steps", "draft_vocab", "lr", "batch_tokens", "seed", "holdout", "max_tokens",
             "eval_every", "patience", "max_records")  # the options a checkpoint must share with the run


@dataclass
class Progress:
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    validation: list[dict[str, Any]] = field(default_factory=list)
    best_loss: float = math.inf
    best_step: int = 0
    best_state: dict[str, torch.Tensor] = field(default_factory=dict)
    bad_evals: int = 0
    stopped_early: bool = False
    out_of_time: bool = False  # this sitting reached its deadline (not kept in the checkpoint)


def learning_rate(step: int, options: TrainOptions) -> float:
    warmup = max(1, options.steps // 20)
    if step < warmup:
        return options.lr * (step + 1) / warmup
    done = (step - warmup) / max(1, options.steps - warmup)
    return options.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def validate(head: Eagle3Head, batches: list[Batch], depth: int) -> dict[str, Any]:
    """Mean training-time-test loss and greedy acceptance per position on `batches`."""
    head.eval()
    with torch.no_grad():
        loss = sum(float(evaluate.run_steps(head, batch, depth).loss) for batch in batches) / max(1, len(batches))
    held = evaluate.acceptance(head, batches, depth)
    head.train()
    return {"loss": round(loss, 5), "acceptance_per_position": held["acceptance_per_position"]}


def _options_of(options: TrainOptions) -> dict[str, Any]:
    return {key: value for key, value in asdict(options).items() if key in RESUMABLE}


def _save(path: Path, head: Eagle3Head, optimizer: torch.optim.Optimizer, generator: torch.Generator,
          progress: Progress, options: TrainOptions) -> None:
    state = {"options": _options_of(options), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
             "generator": generator.get_state(), "torch_rng": torch.get_rng_state(), "progress": asdict(progress)}
    staging = path.with_suffix(".tmp")
    torch.save(state, staging)
    staging.replace(path)


def _resume(path: Path, head: Eagle3Head, optimizer: torch.optim.Optimizer, generator: torch.Generator,
            options: TrainOptions) -> Progress:
    if not path.is_file():
        return Progress()
    # on the CPU: the random states must stay CPU byte tensors (a GPU's would be refused); the head's and
    # the optimizer's tensors move to the head's device as they are loaded
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state["options"] != _options_of(options):
        raise ValueError(f"{path} was written with other options ({state['options']}); use them, "
                         "or another --out, or delete it to start again")
    head.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    return Progress(**{**state["progress"], "out_of_time": False})


def _evaluate(head: Eagle3Head, progress: Progress, validation: list[Batch], options: TrainOptions) -> None:
    scores = validate(head, validation, options.ttt_steps)
    progress.validation.append({"step": progress.step, **scores})
    if scores["loss"] < progress.best_loss:
        progress.best_loss, progress.best_step, progress.bad_evals = scores["loss"], progress.step, 0
        progress.best_state = {k: v.detach().clone() for k, v in head.state_dict().items()}
    else:
        progress.bad_evals += 1
        progress.stopped_early = progress.bad_evals >= options.patience


def fit(head: Eagle3Head, sample: Callable[[torch.Generator], Batch], validation: list[Batch],
        options: TrainOptions, out: Path, progress_bar: bool = True, stop_after: int | None = None,
        deadline: float | None = None) -> Progress:
    """Train `head` in place on batches from `sample` (seeded by the generator it
    is given), resuming from `out/resume.pt`, at most `stop_after` steps in this
    call and no step after `deadline` (`time.monotonic()`); a finished run's
    head, or one that ran out of time, ends as the best one validated."""
    from tqdm import tqdm

    generator = torch.Generator().manual_seed(options.seed)
    torch.manual_seed(options.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=options.lr, betas=(0.9, 0.95), weight_decay=0.0)
    checkpoint = out / RESUME
    progress = _resume(checkpoint, head, optimizer, generator, options)
    head.train()
    last = options.steps if stop_after is None else min(options.steps, progress.step + stop_after)
    bar = tqdm(total=options.steps, initial=progress.step, desc="train", unit="step", disable=not progress_bar)
    while progress.step < last and not progress.stopped_early:
        if deadline is not None and time.monotonic() >= deadline:
            progress.out_of_time = True
            if not progress.validation or progress.validation[-1]["step"] != progress.step:
                _evaluate(head, progress, validation, options)  # the steps since the last validation count too
            break
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(progress.step, options)
        result = evaluate.run_steps(head, sample(generator), options.ttt_steps)
        optimizer.zero_grad()
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        optimizer.step()
        progress.step += 1
        accuracy = [c / n if n else 0.0 for c, n in zip(result.correct, result.counted, strict=True)]
        progress.history.append({"step": progress.step, "loss": round(float(result.loss.detach()), 5),
                                 "accuracy": [round(a, 4) for a in accuracy]})
        bar.update(1)
        bar.set_postfix(loss=f"{progress.history[-1]['loss']:.3f}", acc0=f"{accuracy[0]:.2f}")
        if progress.step % options.eval_every == 0 or progress.step == options.steps:
            _evaluate(head, progress, validation, options)
            _save(checkpoint, head, optimizer, generator, progress, options)
    bar.close()
    if progress.step < options.steps and not progress.stopped_early:
        _save(checkpoint, head, optimizer, generator, progress, options)  # stopped by `stop_after`: resume here
    if progress.best_state and (progress.stopped_early or progress.out_of_time or progress.step >= options.steps):
        head.load_state_dict(progress.best_state)
    head.eval()
    return progress
