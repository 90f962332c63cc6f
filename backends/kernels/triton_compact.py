"""Triton kernel for compact_kv: one program per (request, leading index, head).

A program moves the accepted entries in increasing k. Entry k is read from
slot ``seq_len + accepted_nodes[k]`` (>= seq_len + k) and written to slot
``seq_len + k``; a later entry's source lies beyond every slot written
before it, so the in-place sequential walk never reads a moved-over row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def compact_kv_kernel(
    cache_ptr,  # [L, B, H, S, D]
    seq_lens_ptr,  # int64 [B]
    accepted_ptr,  # int64 [B, N]
    accept_len_ptr,  # int64 [B]
    N,
    H,
    D,
    stride_l,
    stride_b,
    stride_h,
    stride_s,
    stride_d,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    lead_head = tl.program_id(1).to(tl.int64)
    base = cache_ptr + (lead_head // H) * stride_l + b * stride_b + (lead_head % H) * stride_h
    dims = tl.arange(0, BLOCK_D)
    in_row = dims < D
    seq_len = tl.load(seq_lens_ptr + b)
    length = tl.load(accept_len_ptr + b)
    for k in range(1, length + 1):
        source = seq_len + tl.load(accepted_ptr + b * N + k)
        values = tl.load(base + source * stride_s + dims * stride_d, mask=in_row)
        tl.store(base + (seq_len + k) * stride_s + dims * stride_d, values, mask=in_row)


def compact_kv_triton(
    cache: torch.Tensor, seq_lens: torch.Tensor, accepted_nodes: torch.Tensor, accept_len: torch.Tensor
) -> None:
    # [..., B, H, S, D] -> [L, B, H, S, D] as a view, so the move stays in place.
    cache5 = cache.view(-1, *cache.shape[-4:]) if cache.dim() != 4 else cache.unsqueeze(0)
    leading, batch, heads, _, dim = cache5.shape
    device = cache.device
    n = accepted_nodes.shape[1]
    compact_kv_kernel[(batch, leading * heads)](
        cache5,
        seq_lens.to(device=device, dtype=torch.int64).contiguous(),
        accepted_nodes.to(device=device, dtype=torch.int64).contiguous(),
        accept_len.to(device=device, dtype=torch.int64).contiguous(),
        n, heads, dim, *cache5.stride(),
        BLOCK_D=triton.next_power_of_2(dim),
    )
