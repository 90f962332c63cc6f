"""Result types shared by the reference and the Triton tree-verify kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeLayout:
    """Per-request attention layout of a draft tree.

    All tensors are ``[B, N]`` except ``attn_mask`` (``[B, N, N]``). Padding
    nodes (index >= ``num_nodes[b]``) have depth 0, position ``seq_lens[b]``,
    no children, no siblings and an all-False mask row and column.
    """

    attn_mask: torch.Tensor  # bool [B, N, N]: node i sees j iff j is i or an ancestor of i
    position_ids: torch.Tensor  # long [B, N]: seq_lens[b] + depth
    depth: torch.Tensor  # long [B, N]: root depth 0
    first_child: torch.Tensor  # long [B, N]: -1 for none
    next_sibling: torch.Tensor  # long [B, N]: -1 for none, siblings in node index order


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one batch of draft trees."""

    accepted_nodes: torch.Tensor  # long [B, N]: [0, n1, n2, ...] padded with -1
    accept_len: torch.Tensor  # long [B]: accepted draft nodes (root not counted)
    bonus_token: torch.Tensor  # long [B]: token sampled after the last accepted node
