"""EAGLE-2 dynamic draft trees: grow where the draft is confident.

Every node's score is its cumulative draft log probability (the sum along its
path from the root). Level by level, the `top_k` highest-scoring nodes of the
newest level are expanded, each into its `top_k` most probable children;
after `max_depth` levels the `max_nodes - 1` highest-scoring nodes of all
levels form the tree. A child never scores above its parent, so the chosen
nodes always include their ancestors (ties go to the shallower node).

Nodes whose cumulative probability falls below `min_prob` are dropped as they
are generated: on a CPU every verified node costs target time, so an unsure
head drafts a small tree (or none) instead of a full one that will be
rejected, and a level with no node left ends the growth.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from backends.engine.tree import DraftTree


@dataclass(frozen=True)
class TreeShape:
    """Bounds of one draft tree: `max_nodes` counts the root.

    The default is small because every verified node costs target time on a
    CPU: on prompts from sources the shipped head never saw, 4 nodes (2
    children, 2 levels) ran 1.01-1.14x plain decoding where 16 nodes (4
    children, 5 levels) ran 0.71-0.86x (docs/benchmarks/drafts.md)."""

    top_k: int = 2
    max_depth: int = 2
    max_nodes: int = 4
    min_prob: float = 0.05  # of a node's whole path

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.max_depth < 1 or self.max_nodes < 2 or not 0 <= self.min_prob < 1:
            raise ValueError("a draft tree needs top_k >= 1, max_depth >= 1, max_nodes >= 2 and 0 <= min_prob < 1")


@dataclass(frozen=True)
class Candidate:
    score: float  # cumulative log probability
    parent: int  # index of the parent candidate, -1 for the root
    token: int
    depth: int


# expand(chosen, candidates) -> log probabilities of the children of each
# chosen candidate (indices into candidates), one row each
Expand = Callable[[list[int], list[Candidate]], torch.Tensor]


def grow_tree(root: int, root_logprobs: torch.Tensor, expand: Expand, shape: TreeShape,
              vocab: torch.Tensor | None = None) -> tuple[DraftTree, list[Candidate]]:
    """The tree below `root` from its children's log probabilities, calling
    `expand` on the nodes chosen at each level. Column `c` of a row is token
    `vocab[c]` (or `c` without `vocab`). Returns the tree and every candidate
    considered, in the order they were generated."""
    candidates: list[Candidate] = []
    rows, parents = root_logprobs[None], [-1]
    floor = math.log(shape.min_prob) if shape.min_prob > 0 else -math.inf
    for depth in range(1, shape.max_depth + 1):
        level_start = len(candidates)
        k = min(shape.top_k, rows.shape[-1])
        top = torch.topk(rows, k, dim=-1)
        for row, parent in enumerate(parents):
            base = candidates[parent].score if parent >= 0 else 0.0
            for logprob, column in zip(top.values[row].tolist(), top.indices[row].tolist(), strict=True):
                if base + logprob >= floor:
                    token = int(vocab[column]) if vocab is not None else column
                    candidates.append(Candidate(base + logprob, parent, token, depth))
        if depth == shape.max_depth or len(candidates) == level_start:
            break
        level = sorted(range(level_start, len(candidates)), key=lambda i: -candidates[i].score)
        parents = level[: shape.top_k]
        rows = expand(parents, candidates)
    return _best_tree(root, candidates, shape.max_nodes - 1), candidates


def _best_tree(root: int, candidates: list[Candidate], count: int) -> DraftTree:
    """The `count` best candidates as a tree in topological order (by depth,
    then score: the likelier sibling is tried first)."""
    ranked = sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, candidates[i].depth, i))
    chosen = sorted(ranked[:count], key=lambda i: (candidates[i].depth, -candidates[i].score, i))
    node_of = {index: node for node, index in enumerate(chosen, start=1)}
    tree = DraftTree.root_only(root)
    for index in chosen:
        parent = candidates[index].parent
        tree.tokens.append(candidates[index].token)
        tree.parents.append(node_of[parent] if parent >= 0 else 0)
    return tree
