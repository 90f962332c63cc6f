"""Target-distribution processing and the fixed-point form the verifiers use.

Both verifiers (torch reference and Triton) turn each probability into an
integer count of ``2**-PROB_FRACTION_BITS`` units before they add anything up.
Integer sums do not depend on summation order, so the reference and the
kernel (and a GPU with any reduction tree) reach the same decisions bit for bit.
"""

from __future__ import annotations

import torch

# A probability p becomes trunc(p * 2**40) units: finer than float32 keeps
# for any p above 2**-16, and a vocabulary of up to 2**22 tokens still sums
# below 2**63 even if a row is not normalized.
PROB_FRACTION_BITS = 40
PROB_SCALE = float(2**PROB_FRACTION_BITS)


def to_fixed_point(probs: torch.Tensor) -> torch.Tensor:
    """Probabilities -> int64 units (scaling by a power of two is exact)."""
    return (probs.to(torch.float64) * PROB_SCALE).to(torch.int64)


def _per_row(value, logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A scalar or a [B] / [B, N] tensor, shaped to broadcast over logits[..., V]."""
    tensor = torch.as_tensor(value, dtype=dtype, device=logits.device)
    return tensor.reshape(tensor.shape + (1,) * (logits.dim() - tensor.dim()))


def processed_probs(logits: torch.Tensor, temperature=1.0, top_k=0, top_p=1.0) -> torch.Tensor:
    """Softmax of ``logits / temperature`` restricted to top-k and top-p, renormalized.

    ``temperature``, ``top_k`` and ``top_p`` are scalars or per-request tensors
    whose shape is a prefix of ``logits.shape[:-1]`` (e.g. ``[B]`` for
    ``[B, N, V]`` logits). ``top_k <= 0`` and ``top_p >= 1`` disable the filter.
    Temperature must be > 0 (greedy requests use ``verify_greedy``). Ties at the
    k-th logit are all kept. Returns float32 rows that sum to 1.
    """
    temperature = _per_row(temperature, logits, torch.float32)
    if bool((temperature <= 0).any()):
        raise ValueError("temperature must be > 0; use verify_greedy for temperature 0")
    scaled = logits.to(torch.float32) / temperature
    vocab = scaled.shape[-1]

    # Top-k: keep logits >= the k-th largest (only rows with a filter pay for topk).
    top_k = _per_row(top_k, logits, torch.int64).expand(*scaled.shape[:-1], 1)
    filtered = (top_k > 0) & (top_k < vocab)
    if bool(filtered.any()):
        k = torch.where(filtered, top_k, 1)
        largest = scaled.topk(int(k.max()), dim=-1).values
        kth_largest = torch.where(filtered, largest.gather(-1, k - 1), float("-inf"))
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))

    probs = torch.softmax(scaled, dim=-1)
    top_p = _per_row(top_p, logits, torch.float32)
    if bool((top_p < 1).any()):
        keep = _nucleus(probs, top_p) | (top_p >= 1)
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask of each row's smallest top prefix whose mass reaches top_p (at least one token).

    Sorts only the top ``width`` tokens, widening until every filtered row's
    prefix reaches its top_p inside the window (tokens outside it are dropped).
    """
    live = int((probs > 0).sum(dim=-1).max())
    width = min(live, 256)
    while True:
        sorted_probs, order = probs.topk(width, dim=-1)
        mass_through = sorted_probs.cumsum(dim=-1)
        if width == live or bool(((mass_through[..., -1:] >= top_p) | (top_p >= 1)).all()):
            break
        width = min(live, width * 4)
    keep_sorted = mass_through - sorted_probs < top_p
    keep_sorted[..., 0] = True
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, keep_sorted)
