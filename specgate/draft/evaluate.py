"""Scoring an EAGLE-3 head: training-time-test losses, held-out acceptance, plots.

Alignment (see `backends.engine.eagle3.head`): at draft step k the entry at
index t reads token t+1+k and predicts token t+2+k; the label is the target's
greedy token there (`argmax[t+1+k]`), counted where that token is a response
token. Step 0 reads the real next token; later steps read the target's greedy
tokens (what the head's accepted drafts would have been) on response positions
and the real tokens on prompt positions, which a draft never covers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from backends.engine.eagle3.head import Eagle3Head, TrainingTimeTest


@dataclass
class Batch:
    features: torch.Tensor  # [B, T, 3H]
    input_ids: torch.Tensor  # [B, T]
    argmax: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T] bool: response token and not padding

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.features.to(device), self.input_ids.to(device), self.argmax.to(device),
                     self.loss_mask.to(device))


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """`x[:, t + n]` at index t, zero (False) past the end."""
    return torch.cat([x[:, n:], torch.zeros_like(x[:, :n])], 1)


@dataclass
class StepResult:
    loss: torch.Tensor  # the weighted sum over steps
    correct: list[int]  # per step: draft token == target's greedy token, on counted positions
    counted: list[int]
    hits: list[torch.Tensor]  # per step, bool [B, T]
    valid: list[torch.Tensor]  # per step, bool [B, T]


def run_steps(head: Eagle3Head, batch: Batch, steps: int, decay: float = 0.8) -> StepResult:
    """Training-time test over `steps` draft steps: the loss (cross-entropy to the
    target's greedy token, masked to response tokens, step k weighted `decay**k`)
    and per-step hits."""
    device = next(head.parameters()).device
    batch = batch.to(device)
    to_draft = head.target_to_draft(torch.arange(head.config.vocab_size, device=device))
    hidden = head.fuse(batch.features)
    positions = torch.arange(batch.input_ids.shape[1], device=device)[None].expand(batch.input_ids.shape[0], -1)
    context = TrainingTimeTest()
    result = StepResult(hidden.new_zeros(()), [], [], [], [])
    for k in range(steps):
        tokens = _shift(batch.input_ids, 1 + k)
        if k:  # a drafted position holds the target's greedy token; a prompt position its own
            tokens = torch.where(_shift(batch.loss_mask, 1 + k), _shift(batch.argmax, k), tokens)
        labels = _shift(batch.argmax, 1 + k)
        mask = _shift(batch.loss_mask, 2 + k)
        hidden, logits = head(hidden, tokens, positions + k, context=context)
        draft_labels = to_draft[labels]
        trainable = mask & (draft_labels >= 0)
        if trainable.any():
            losses = F.cross_entropy(logits[trainable], draft_labels[trainable])
            result.loss = result.loss + decay**k * losses
        hits = (head.draft_to_target(logits.argmax(-1)) == labels) & mask
        result.hits.append(hits)
        result.valid.append(mask)
        result.correct.append(int(hits.sum()))
        result.counted.append(int(mask.sum()))
    return result


def acceptance(head: Eagle3Head, batches: list[Batch], depth: int, decoded: bool = False) -> dict[str, Any]:
    """Greedy acceptance per draft position on held-out batches: position k counts
    as accepted when positions 0..k all equal the target's greedy tokens.

    A draft starts after every response token but the last; with `decoded`,
    only where a chain decoder would start one: after the first, then after
    each draft's accepted tokens and the target's own next token. The two
    differ because a decoder skips the tokens it accepted, and a token the
    head predicted is often followed by another it predicts."""
    drafts = 0
    accepted = [0] * depth
    with torch.no_grad():
        for batch in batches:
            result = run_steps(head, batch, depth)
            batch = batch.to(next(head.parameters()).device)
            # a draft starts after a token the target wrote: both t+1 and t+2 are response tokens
            chain = result.valid[0] & _shift(batch.loss_mask, 1)
            if decoded:
                chain = decoder_starts(chain, torch.stack(result.hits), depth)
            drafts += int(chain.sum())
            for k in range(depth):
                chain &= result.hits[k]
                accepted[k] += int(chain.sum())
    per_position = [a / drafts if drafts else 0.0 for a in accepted]
    conditional = [accepted[0] / drafts if drafts else 0.0] + [
        accepted[k] / accepted[k - 1] if accepted[k - 1] else 0.0 for k in range(1, depth)
    ]
    return {
        "drafts": drafts,
        "accepted_per_position": accepted,
        "acceptance_per_position": [round(x, 4) for x in per_position],
        "conditional_acceptance_per_position": [round(x, 4) for x in conditional],
        "mean_accepted_length": round(sum(per_position), 4),
    }


def decoder_starts(starts: torch.Tensor, hits: torch.Tensor, depth: int) -> torch.Tensor:
    """Of the possible draft starts `[B, T]`, those a chain decoder of `depth` drafts
    reaches: from each row's first, the next is one past the draft's accepted run
    (`hits`, `[depth, B, T]`), or the first possible start after it."""
    possible, run = starts.cpu().tolist(), hits.cpu().tolist()
    reached = torch.zeros_like(starts)
    for b, row in enumerate(possible):
        t = 0
        while t < len(row):
            if not row[t]:
                t += 1
                continue
            reached[b, t] = True
            accepted = 0
            while accepted < depth and run[accepted][b][t]:
                accepted += 1
            t += accepted + 1
    return reached


def write_json(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_history(history: list[dict[str, Any]], held_out: dict[str, Any], out: str | os.PathLike[str]) -> list[Path]:
    """loss.png and accuracy.png (training accuracy per draft position, smoothed;
    the held-out conditional acceptance as dashed lines)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    directory = Path(out)
    steps = [h["step"] for h in history]
    window = max(1, len(history) // 20)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, [h["loss"] for h in history], alpha=0.3, label="loss")
    ax.plot(steps, _smooth([h["loss"] for h in history], window), label=f"mean of {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("training-time-test loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(directory / "loss.png", dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in range(len(history[0]["accuracy"]) if history else 0):
        line = ax.plot(steps, _smooth([h["accuracy"][k] for h in history], window), label=f"position {k + 1}")
        conditional = held_out.get("conditional_acceptance_per_position") or []
        if k < len(conditional):
            ax.axhline(conditional[k], linestyle="--", color=line[0].get_color())
    ax.set_xlabel("step")
    ax.set_ylabel("draft == target greedy (dashed: held-out)")
    ax.set_ylim(0, 1)
    if history:  # a run out of time before its first step has no lines
        ax.legend()
    fig.tight_layout()
    fig.savefig(directory / "accuracy.png", dpi=100)
    plt.close(fig)
    return [directory / "loss.png", directory / "accuracy.png"]


def plot_validation(validation: list[dict[str, Any]], out: str | os.PathLike[str]) -> Path:
    """validation.png: the held-out loss and acceptance per position at each validation."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    path = Path(out) / "validation.png"
    steps = [v["step"] for v in validation]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(steps, [v["loss"] for v in validation], marker="o")
    left.set_xlabel("step")
    left.set_ylabel("held-out training-time-test loss")
    depth = len(validation[0]["acceptance_per_position"]) if validation else 0
    for k in range(depth):
        right.plot(steps, [v["acceptance_per_position"][k] for v in validation], marker="o", label=f"position {k + 1}")
    right.set_xlabel("step")
    right.set_ylabel("held-out acceptance (greedy)")
    right.set_ylim(0, 1)
    if depth:
        right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
