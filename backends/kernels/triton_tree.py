"""Triton kernel for build_tree: one program per request, the whole tree in registers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backends.kernels.types import TreeLayout


@triton.jit
def build_tree_kernel(
    parents_ptr,  # int64 [B, N]
    seq_lens_ptr,  # int64 [B]
    num_nodes_ptr,  # int64 [B]
    mask_ptr,  # bool [B, N, N]
    position_ptr,  # int64 [B, N]
    depth_ptr,  # int64 [B, N]
    first_child_ptr,  # int64 [B, N]
    next_sibling_ptr,  # int64 [B, N]
    N,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    node = tl.arange(0, BLOCK_N)
    count = tl.load(num_nodes_ptr + b)
    valid = (node < count) & (node < N)
    parents_row = parents_ptr + b * N
    parent = tl.load(parents_row + node, mask=valid, other=-1)

    # Every node walks up to the root in lockstep; step t marks its t-th ancestor.
    walker = tl.where(valid, node.to(tl.int64), -1)
    seen = tl.zeros([BLOCK_N, BLOCK_N], dtype=tl.int32)
    depth = tl.zeros([BLOCK_N], dtype=tl.int64)
    for _ in range(0, N):
        alive = walker >= 0
        hit = (node[None, :] == walker[:, None]) & alive[:, None]
        seen = seen | hit.to(tl.int32)
        walker = tl.load(parents_row + tl.maximum(walker, 0), mask=alive, other=-1)
        depth += (walker >= 0).to(tl.int64)

    rows = node[:, None]
    cols = node[None, :]
    out_2d = (rows < N) & (cols < N)
    tl.store(mask_ptr + b * N * N + rows * N + cols, seen != 0, mask=out_2d)

    none = BLOCK_N
    child_of = (parent[None, :] == rows) & valid[None, :]
    first_child = tl.min(tl.where(child_of, cols, none), axis=1)
    sibling_after = (parent[None, :] == parent[:, None]) & (cols > rows) & valid[None, :] & (parent[:, None] >= 0)
    next_sibling = tl.min(tl.where(sibling_after, cols, none), axis=1)

    out = b * N + node
    in_row = node < N
    seq_len = tl.load(seq_lens_ptr + b)
    tl.store(position_ptr + out, seq_len + depth, mask=in_row)
    tl.store(depth_ptr + out, depth, mask=in_row)
    tl.store(first_child_ptr + out, tl.where(first_child == none, -1, first_child).to(tl.int64), mask=in_row)
    tl.store(next_sibling_ptr + out, tl.where(next_sibling == none, -1, next_sibling).to(tl.int64), mask=in_row)


def block_size(n: int) -> int:
    """Power-of-two register tile that holds n entries (at least 16)."""
    return max(16, triton.next_power_of_2(n))


def build_tree_triton(parents: torch.Tensor, seq_lens: torch.Tensor, num_nodes: torch.Tensor) -> TreeLayout:
    batch, n = parents.shape
    device = parents.device
    parents = parents.to(torch.int64).contiguous()
    seq_lens = seq_lens.to(device=device, dtype=torch.int64).contiguous()
    num_nodes = num_nodes.to(device=device, dtype=torch.int64).contiguous()
    attn_mask = torch.empty(batch, n, n, dtype=torch.bool, device=device)
    position_ids, depth, first_child, next_sibling = (
        torch.empty(batch, n, dtype=torch.int64, device=device) for _ in range(4)
    )
    build_tree_kernel[(batch,)](
        parents, seq_lens, num_nodes, attn_mask, position_ids, depth, first_child, next_sibling,
        n, BLOCK_N=block_size(n),
    )
    return TreeLayout(
        attn_mask=attn_mask,
        position_ids=position_ids,
        depth=depth,
        first_child=first_child,
        next_sibling=next_sibling,
    )
