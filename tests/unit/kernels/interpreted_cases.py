"""The Triton kernels, run by Triton's CPU interpreter, equal the reference bit for bit.

Not collected directly: ``test_triton_kernels.py`` runs this module in a fresh
pytest process with TRITON_INTERPRET=1, because ``triton.jit`` (including
Triton's own library functions) picks interpreter or compiler at import time.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from backends.kernels import build_tree, compact_kv, verify_greedy, verify_sampling
from tests.unit.kernels.trees import SHAPES, padded_batch, random_batch, random_tokens, sampling_case

BACKENDS = ("torch", "triton")


def assert_same(reference, candidate):
    for field in reference.__dataclass_fields__:
        expected, actual = getattr(reference, field), getattr(candidate, field)
        assert actual.dtype == expected.dtype, field
        assert torch.equal(actual, expected), field


def both(fn, *args):
    """Run ``fn`` with each backend and check they agree; return the reference result."""
    reference, candidate = (fn(*args, backend=backend) for backend in BACKENDS)
    assert_same(reference, candidate)
    return reference


@pytest.mark.parametrize("width", [64, 5])
def test_build_tree_matches_reference(width):
    parents, num_nodes = random_batch(random.Random(width), batch=len(SHAPES) + 1, width=width)
    seq_lens = torch.randint(0, 500, (parents.shape[0],))
    both(build_tree, parents, seq_lens, num_nodes)


def test_build_tree_pads_a_batch_of_chains_stars_and_depth_one():
    parents, num_nodes = padded_batch([[-1, 0, 1, 2], [-1, 0, 0, 0], [-1, 0], [-1]], width=6)
    layout = both(build_tree, parents, torch.tensor([0, 4, 8, 12]), num_nodes)
    assert layout.depth.tolist()[0][:4] == [0, 1, 2, 3] and layout.depth.tolist()[1][:4] == [0, 1, 1, 1]


def test_verify_greedy_matches_reference_on_random_trees():
    rng = random.Random(1)
    parents, num_nodes = random_batch(rng, batch=8, width=64)
    layout = build_tree(parents, torch.zeros(8, dtype=torch.long), num_nodes)
    draft, argmax = random_tokens((8, 64), 3, 1), random_tokens((8, 64), 3, 2)
    # Let the target agree with most children, so that long paths get accepted.
    for b, i in itertools.product(range(8), range(1, 64)):
        if i < num_nodes[b] and rng.random() < 0.7:
            argmax[b, parents[b, i]] = draft[b, i]
    result = both(verify_greedy, draft, argmax, layout, num_nodes)
    assert result.accept_len.max() >= 3


def test_verify_greedy_with_no_accepted_node():
    parents, num_nodes = random_batch(random.Random(2), batch=5, width=16)
    layout = build_tree(parents, torch.zeros(5, dtype=torch.long), num_nodes)
    draft, argmax = random_tokens((5, 16), 3, 3), torch.full((5, 16), 7)
    result = both(verify_greedy, draft, argmax, layout, num_nodes)
    assert result.accept_len.tolist() == [0] * 5 and result.bonus_token.tolist() == [7] * 5


@pytest.mark.parametrize("vocab", [4097, 5])
def test_verify_sampling_matches_reference(vocab):
    # 4097 tokens leave one token in a second vocabulary tile; 5 give duplicate sibling drafts.
    result = both(verify_sampling, *sampling_case(batch=6, width=64, vocab=vocab, seed=vocab))
    assert result.accept_len.max() >= 2


def test_verify_sampling_with_no_accepted_node():
    coins = torch.full((4, 12), 1.0 - 2.0**-24)
    result = both(verify_sampling, *sampling_case(batch=4, width=12, vocab=40, seed=9, coins=coins))
    assert result.accept_len.tolist() == [0] * 4


def test_compact_kv_matches_reference():
    draft, probs, layout, num_nodes, coins, bonus = sampling_case(batch=4, width=16, vocab=6, seed=4)
    result = verify_sampling(draft, probs, layout, num_nodes, coins, bonus)
    assert result.accept_len.max() >= 1
    seq_lens = torch.tensor([0, 3, 9, 20])
    caches = [torch.randn(2, 4, 2, 40, 12) for _ in BACKENDS]  # [K/V, B, H, S, D]
    caches[1].copy_(caches[0])
    for cache, backend in zip(caches, BACKENDS, strict=True):
        compact_kv(cache, seq_lens, result.accepted_nodes, result.accept_len, backend=backend)
    assert torch.equal(caches[0], caches[1])
