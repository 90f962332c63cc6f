"""Draft-tree builders for the kernel tests and bench/kernels.py: parent lists, padded batches
and verify_sampling's inputs."""

from __future__ import annotations

import random

import torch

from backends.kernels import build_tree, processed_probs

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


def random_tokens(shape, vocab: int, seed: int, device: str = "cpu") -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator(device).manual_seed(seed), device=device)


def sampling_case(batch: int, width: int, vocab: int, seed: int, coins: torch.Tensor | None = None,
                  device: str = "cpu"):
    """verify_sampling's arguments: random trees, target rows at temperature 0.8 and top-k 50
    (at most half the vocabulary), coins; drawn on `device` by generators seeded with `seed`."""
    generator = torch.Generator(device).manual_seed(seed)
    parents, num_nodes = (t.to(device) for t in random_batch(random.Random(seed), batch=batch, width=width))
    layout = build_tree(parents, torch.zeros(batch, dtype=torch.long, device=device), num_nodes, backend="torch")
    logits = torch.randn(batch, width, vocab, generator=generator, device=device) * 3
    probs = processed_probs(logits, temperature=0.8, top_k=max(2, min(50, vocab // 2)))
    # Each node drafts one of its parent's three likeliest tokens, so paths get accepted.
    likely = probs.topk(3, dim=-1).indices.gather(1, parents.clamp(min=0)[..., None].expand(-1, -1, 3))
    draft = likely.gather(2, random_tokens((batch, width, 1), 3, seed, device))[..., 0]
    if coins is None:
        coins = torch.rand(batch, width, generator=generator, device=device)
    return draft, probs, layout, num_nodes, coins, torch.rand(batch, generator=generator, device=device)
