"""Triton kernels for verify_greedy and verify_sampling: one program per request.

Both walk the tree with first_child / next_sibling links. Each loop step tries
one child of the current node, so N steps always finish the walk. Decisions
use the same integer units and float64 comparisons as the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backends.kernels.probs import PROB_SCALE
from backends.kernels.triton_tree import block_size
from backends.kernels.types import TreeLayout, VerifyResult

# Vocabulary entries one program reads per loop step. Each request's walk is
# one program, so a row's sums are serial: 256 a step took 0.9-2.2 ms for one
# request at a 128k vocabulary on an H200, slower than the torch reference.
VOCAB_TILE = 4096
SAMPLING_WARPS = 8


@triton.jit
def verify_greedy_kernel(
    tokens_ptr,  # int64 [B, N]
    argmax_ptr,  # int64 [B, N]
    first_child_ptr,  # int64 [B, N]
    next_sibling_ptr,  # int64 [B, N]
    accepted_ptr,  # int64 [B, N], prefilled with -1
    accept_len_ptr,  # int64 [B]
    bonus_ptr,  # int64 [B]
    N,
):
    b = tl.program_id(0).to(tl.int64)
    row = b * N
    child = tl.load(first_child_ptr + row)
    cur = child * 0
    length = child * 0
    tl.store(accepted_ptr + row, cur)
    for _ in range(0, N):
        active = child >= 0
        slot = row + tl.maximum(child, 0)
        token = tl.load(tokens_ptr + slot, mask=active, other=-1)
        hit = active & (token == tl.load(argmax_ptr + row + cur))
        length += hit.to(tl.int64)
        tl.store(accepted_ptr + row + length, child, mask=hit)
        cur = tl.where(hit, child, cur)
        down = tl.load(first_child_ptr + slot, mask=hit, other=-1)
        across = tl.load(next_sibling_ptr + slot, mask=active & (hit == 0), other=-1)
        child = tl.where(hit, down, across)
    tl.store(accept_len_ptr + b, length)
    tl.store(bonus_ptr + b, tl.load(argmax_ptr + row + cur))


@triton.jit
def _row_units_sum(row_ptr, V, SCALE: tl.constexpr, BLOCK_V: tl.constexpr):
    """Sum of the fixed-point units of one probability row (order-independent)."""
    total = tl.zeros([], dtype=tl.int64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        probs = tl.load(row_ptr + offs, mask=offs < V, other=0.0)
        total += tl.sum((probs.to(tl.float64) * SCALE).to(tl.int64), axis=0)
    return total


@triton.jit
def verify_sampling_kernel(
    tokens_ptr,  # int64 [B, N]
    probs_ptr,  # float [B, N, V], last dim contiguous
    uniforms_ptr,  # float [B, N]
    bonus_uniforms_ptr,  # float [B]
    first_child_ptr,  # int64 [B, N]
    next_sibling_ptr,  # int64 [B, N]
    accepted_ptr,  # int64 [B, N], prefilled with -1
    accept_len_ptr,  # int64 [B]
    bonus_ptr,  # int64 [B]
    N,
    V,
    stride_pb,
    stride_pn,
    SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = b * N
    slots = tl.arange(0, BLOCK_N)
    child = tl.load(first_child_ptr + row)
    cur = child * 0
    length = child * 0
    tl.store(accepted_ptr + row, cur)
    total = _row_units_sum(probs_ptr + b * stride_pb, V, SCALE, BLOCK_V)
    # Tokens of the current node's rejected children (their units are zero now).
    rejected = tl.full([BLOCK_N], -1, dtype=tl.int64)
    num_rejected = child * 0
    for _ in range(0, N):
        active = child >= 0
        slot = row + tl.maximum(child, 0)
        token = tl.load(tokens_ptr + slot, mask=active, other=0)
        coin = tl.load(uniforms_ptr + slot, mask=active, other=1.0).to(tl.float64)
        prob = tl.load(probs_ptr + b * stride_pb + cur * stride_pn + token, mask=active, other=0.0)
        mass = (prob.to(tl.float64) * SCALE).to(tl.int64)
        already_rejected = tl.max((rejected == token).to(tl.int32), axis=0) > 0
        mass = tl.where(already_rejected, 0, mass)
        hit = active & (coin * total.to(tl.float64) < mass.to(tl.float64))
        miss = active & (hit == 0)

        length += hit.to(tl.int64)
        tl.store(accepted_ptr + row + length, child, mask=hit)
        rejected = tl.where(miss & (slots == num_rejected), token, rejected)
        num_rejected += miss.to(tl.int64)
        total -= tl.where(miss, mass, 0)
        cur = tl.where(hit, child, cur)
        down = tl.load(first_child_ptr + slot, mask=hit, other=-1)
        across = tl.load(next_sibling_ptr + slot, mask=miss, other=-1)
        child = tl.where(hit, down, across)
        if hit:
            rejected = tl.full([BLOCK_N], -1, dtype=tl.int64)
            num_rejected = num_rejected * 0
            total = _row_units_sum(probs_ptr + b * stride_pb + cur * stride_pn, V, SCALE, BLOCK_V)

    # Bonus token: inverse CDF over the residual units of the last node.
    threshold = tl.load(bonus_uniforms_ptr + b).to(tl.float64) * total.to(tl.float64)
    row_ptr = probs_ptr + b * stride_pb + cur * stride_pn
    running = total * 0
    below = total * 0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        in_vocab = offs < V
        probs = tl.load(row_ptr + offs, mask=in_vocab, other=0.0)
        units = (probs.to(tl.float64) * SCALE).to(tl.int64)
        for k in range(0, num_rejected):  # few: the last node's rejected children
            gone = tl.sum(tl.where(slots == k, rejected, 0), axis=0)
            units = tl.where(offs == gone, 0, units)
        cumulative = running + tl.cumsum(units, axis=0)
        below += tl.sum((in_vocab & (cumulative.to(tl.float64) <= threshold)).to(tl.int64), axis=0)
        running += tl.sum(units, axis=0)
    tl.store(accept_len_ptr + b, length)
    tl.store(bonus_ptr + b, tl.minimum(below, V - 1))


def _new_result(batch: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    accepted = torch.full((batch, n), -1, dtype=torch.int64, device=device)
    accept_len = torch.empty(batch, dtype=torch.int64, device=device)
    bonus = torch.empty(batch, dtype=torch.int64, device=device)
    return accepted, accept_len, bonus


def _long(tensor: torch.Tensor, device) -> torch.Tensor:
    return tensor.to(device=device, dtype=torch.int64).contiguous()


def verify_greedy_triton(
    draft_tokens: torch.Tensor, target_argmax: torch.Tensor, layout: TreeLayout, num_nodes: torch.Tensor
) -> VerifyResult:
    batch, n = draft_tokens.shape
    device = draft_tokens.device
    accepted, accept_len, bonus = _new_result(batch, n, device)
    verify_greedy_kernel[(batch,)](
        _long(draft_tokens, device), _long(target_argmax, device),
        _long(layout.first_child, device), _long(layout.next_sibling, device),
        accepted, accept_len, bonus, n,
    )
    return VerifyResult(accepted_nodes=accepted, accept_len=accept_len, bonus_token=bonus)


def verify_sampling_triton(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    layout: TreeLayout,
    num_nodes: torch.Tensor,
    uniforms: torch.Tensor,
    bonus_uniforms: torch.Tensor,
) -> VerifyResult:
    batch, n = draft_tokens.shape
    vocab = target_probs.shape[-1]
    device = draft_tokens.device
    if target_probs.stride(-1) != 1:
        target_probs = target_probs.contiguous()
    accepted, accept_len, bonus = _new_result(batch, n, device)
    verify_sampling_kernel[(batch,)](
        _long(draft_tokens, device), target_probs,
        uniforms.to(device).contiguous(), bonus_uniforms.to(device).contiguous(),
        _long(layout.first_child, device), _long(layout.next_sibling, device),
        accepted, accept_len, bonus,
        n, vocab, target_probs.stride(0), target_probs.stride(1),
        SCALE=PROB_SCALE, BLOCK_N=block_size(n), BLOCK_V=min(VOCAB_TILE, block_size(vocab)),
        num_warps=SAMPLING_WARPS,
    )
    return VerifyResult(accepted_nodes=accepted, accept_len=accept_len, bonus_token=bonus)
