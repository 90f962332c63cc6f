"""Draft-tree builders for the kernel tests: parent lists and padded batches."""

from __future__ import annotations

import random

import torch

SHAPES = ("random", "chain", "star", "depth1", "root_only")


def tree_parents(rng: random.Random, size: int, shape: str) -> list[int]:
    """Parent list of a ``size``-node tree in topological order (node 0 is the root)."""
    if shape == "root_only" or size == 1:
        return [-1]
    if shape == "chain":
        return [-1] + list(range(size - 1))
    if shape in ("star", "depth1"):
        return [-1] + [0] * (size - 1)
    return [-1] + [rng.randrange(i) for i in range(1, size)]


def padded_batch(trees: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, width] parents padded with -1, and the real node counts."""
    parents = torch.full((len(trees), width), -1, dtype=torch.long)
    for b, tree in enumerate(trees):
        parents[b, : len(tree)] = torch.tensor(tree)
    return parents, torch.tensor([len(tree) for tree in trees])


def random_batch(rng: random.Random, batch: int, width: int, shapes=SHAPES):
    """A batch mixing tree shapes and sizes, each tree padded to ``width`` nodes."""
    trees = []
    for b in range(batch):
        shape = shapes[b % len(shapes)]
        size = 2 if shape == "depth1" else rng.randint(1, width)
        trees.append(tree_parents(rng, size, shape))
    return padded_batch(trees, width)


def ancestors(parents: list[int], node: int) -> list[int]:
    """The node itself and every ancestor up to the root."""
    chain = []
    while node >= 0:
        chain.append(node)
        node = parents[node]
    return chain
