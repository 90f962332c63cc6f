"""Plain torch reference of the tree-verify kernels (CPU path and test oracle).

Conventions (see docs/kernels.md): node 0 is the root, ``parents[b, i] < i``,
nodes ``>= num_nodes[b]`` are padding, node i's KV entry sits at slot
``seq_lens[b] + i`` during verification.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from backends.kernels.probs import to_fixed_point
from backends.kernels.types import TreeLayout, VerifyResult


def build_tree_reference(parents: torch.Tensor, seq_lens: torch.Tensor, num_nodes: torch.Tensor) -> TreeLayout:
    """Ancestor mask, depths, positions and child/sibling links of each tree."""
    batch, n = parents.shape
    device = parents.device
    node = torch.arange(n, device=device)
    valid = node[None, :] < num_nodes.to(device)[:, None]  # [B, N]
    parents = torch.where(valid, parents.long(), -1)

    # Walk every node up to the root at once: step t marks the t-th ancestor.
    attn_mask = torch.zeros(batch, n, n, dtype=torch.bool, device=device)
    walker = torch.where(valid, node[None, :], -1)
    depth = torch.zeros(batch, n, dtype=torch.long, device=device)
    for _ in range(n):
        alive = walker >= 0
        if not bool(alive.any()):
            break
        attn_mask |= (node[None, None, :] == walker[:, :, None]) & alive[:, :, None]
        walker = torch.where(alive, parents.gather(1, walker.clamp(min=0)), -1)
        depth += (walker >= 0).long()

    # child_of[b, i, j]: node j is a child of node i.
    child_of = (parents[:, None, :] == node[None, :, None]) & valid[:, None, :]
    none = torch.full_like(child_of, n, dtype=torch.long)
    first_child = torch.where(child_of, node[None, None, :], none).min(dim=2).values
    # sibling_after[b, i, j]: j > i shares i's parent (the root has no siblings).
    same_parent = parents[:, None, :] == parents[:, :, None]
    sibling_after = same_parent & (node[None, None, :] > node[None, :, None]) & valid[:, None, :]
    sibling_after &= (parents >= 0)[:, :, None]
    next_sibling = torch.where(sibling_after, node[None, None, :], none).min(dim=2).values

    return TreeLayout(
        attn_mask=attn_mask,
        position_ids=seq_lens.to(device).long()[:, None] + depth,
        depth=depth,
        first_child=torch.where(first_child == n, -1, first_child),
        next_sibling=torch.where(next_sibling == n, -1, next_sibling),
    )


def _children(layout_lists: tuple[list, list], node: int) -> list[int]:
    first_child, next_sibling = layout_lists
    child, out = first_child[node], []
    while child >= 0:
        out.append(child)
        child = next_sibling[child]
    return out


def _rows(batch: int, n: int, device, row: Callable[[int], tuple[list[int], int]]) -> VerifyResult:
    """Gather each row's accepted path (root first) and bonus token, as `row(b)` gives them."""
    accepted = torch.full((batch, n), -1, dtype=torch.long, device=device)
    accept_len = torch.zeros(batch, dtype=torch.long, device=device)
    bonus = torch.zeros(batch, dtype=torch.long, device=device)
    for b in range(batch):
        path, bonus[b] = row(b)
        accepted[b, : len(path)] = torch.tensor(path)
        accept_len[b] = len(path) - 1
    return VerifyResult(accepted_nodes=accepted, accept_len=accept_len, bonus_token=bonus)


def _links(layout: TreeLayout, b: int) -> tuple[list, list]:
    return layout.first_child[b].tolist(), layout.next_sibling[b].tolist()


def verify_greedy_reference(
    draft_tokens: torch.Tensor, target_argmax: torch.Tensor, layout: TreeLayout, num_nodes: torch.Tensor
) -> VerifyResult:
    """Follow, level by level, the first child whose token is the target's argmax."""

    def row(b: int) -> tuple[list[int], int]:
        links = _links(layout, b)
        tokens, argmax = draft_tokens[b].tolist(), target_argmax[b].tolist()
        path = [0]
        while True:
            want = argmax[path[-1]]
            match = [c for c in _children(links, path[-1]) if tokens[c] == want]
            if not match:
                return path, argmax[path[-1]]
            path.append(match[0])

    return _rows(*draft_tokens.shape, draft_tokens.device, row)


def sample_from_units(units: torch.Tensor, total: int, coin: float) -> int:
    """Inverse CDF on integer units: first token whose cumulative units exceed coin * total."""
    threshold = float(coin) * float(total)
    below = units.cumsum(0).to(torch.float64) <= threshold
    return min(int(below.sum()), units.shape[0] - 1)


def verify_sampling_reference(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    layout: TreeLayout,
    num_nodes: torch.Tensor,
    uniforms: torch.Tensor,
    bonus_uniforms: torch.Tensor,
) -> VerifyResult:
    """Multi-draft rejection sampling down the tree (drafts are point masses).

    At node ``cur`` with residual units ``p`` (sum ``total``), child c is accepted
    iff ``u[c] * total < p[token(c)]`` in float64; a rejected child's token is
    removed from ``p``. With no child accepted, the bonus token is drawn from
    ``p`` by inverse CDF with ``bonus_uniforms``.
    """

    def row(b: int) -> tuple[list[int], int]:
        links = _links(layout, b)
        tokens, coins = draft_tokens[b].tolist(), uniforms[b].tolist()
        path = [0]
        while True:
            units = to_fixed_point(target_probs[b, path[-1]])
            total = int(units.sum())
            chosen = None
            for child in _children(links, path[-1]):
                mass = int(units[tokens[child]])
                if float(coins[child]) * float(total) < float(mass):
                    chosen = child
                    break
                units[tokens[child]] = 0
                total -= mass
            if chosen is None:
                return path, sample_from_units(units, total, float(bonus_uniforms[b]))
            path.append(chosen)

    return _rows(*draft_tokens.shape, draft_tokens.device, row)


def compact_kv_reference(
    cache: torch.Tensor, seq_lens: torch.Tensor, accepted_nodes: torch.Tensor, accept_len: torch.Tensor
) -> None:
    """In place: slot ``seq_lens + accepted_nodes[k]`` -> ``seq_lens + k`` for k in 1..accept_len.

    ``cache`` is ``[..., B, H, S, D]``; leading dimensions (layers, K/V) are moved together.
    """
    for b in range(cache.shape[-4]):
        length = int(accept_len[b])
        if length == 0:
            continue
        start = int(seq_lens[b])
        src = start + accepted_nodes[b, 1 : length + 1].to(device=cache.device, dtype=torch.long)
        dst = torch.arange(start + 1, start + length + 1, device=cache.device)
        rows = cache[..., b, :, :, :]
        rows[..., dst, :] = rows[..., src, :]
