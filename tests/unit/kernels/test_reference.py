"""Behaviour of the torch reference kernels on hand-built and random trees."""

from __future__ import annotations

import random

import pytest
import torch

from backends.kernels import build_tree, compact_kv, processed_probs, verify_greedy
from tests.unit.kernels.trees import ancestors, padded_batch, random_batch

pytestmark = pytest.mark.slow  # torch

#        0
#      /   \
#     1     2
#    / \     \
#   3   4     5
HAND_TREE = [-1, 0, 0, 1, 1, 2]


def test_build_tree_hand_built_layout():
    parents, num_nodes = padded_batch([HAND_TREE, [-1, 0]], width=8)
    layout = build_tree(parents, torch.tensor([10, 3]), num_nodes)

    assert layout.depth[0].tolist() == [0, 1, 1, 2, 2, 2, 0, 0]
    assert layout.position_ids[0].tolist() == [10, 11, 11, 12, 12, 12, 10, 10]
    assert layout.position_ids[1].tolist()[:2] == [3, 4]
    assert layout.first_child[0].tolist() == [1, 3, 5, -1, -1, -1, -1, -1]
    assert layout.next_sibling[0].tolist() == [-1, 2, -1, 4, -1, -1, -1, -1]
    expected_rows = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 4}, 5: {0, 2, 5}}
    for node, visible in expected_rows.items():
        assert set(layout.attn_mask[0, node].nonzero().flatten().tolist()) == visible
    assert not layout.attn_mask[0, 6:].any() and not layout.attn_mask[0, :, 6:].any()
    assert not layout.attn_mask[1, 2:].any()


def test_build_tree_matches_parent_chasing_on_random_trees():
    rng = random.Random(7)
    parents, num_nodes = random_batch(rng, batch=10, width=64)
    seq_lens = torch.randint(0, 1000, (10,))
    layout = build_tree(parents, seq_lens, num_nodes)
    for b in range(10):
        tree = parents[b, : num_nodes[b]].tolist()
        for node in range(len(tree)):
            chain = ancestors(tree, node)
            assert set(layout.attn_mask[b, node].nonzero().flatten().tolist()) == set(chain)
            assert layout.depth[b, node] == len(chain) - 1
            assert layout.position_ids[b, node] == seq_lens[b] + len(chain) - 1
            children = [c for c in range(len(tree)) if tree[c] == node]
            assert layout.first_child[b, node] == (children[0] if children else -1)
            siblings = [s for s in range(node + 1, len(tree)) if node > 0 and tree[s] == tree[node]]
            assert layout.next_sibling[b, node] == (siblings[0] if siblings else -1)


VOCAB = 11


def next_token(prefix: list[int]) -> int:
    """A deterministic toy target: its greedy choice after ``prefix``."""
    return (sum(t * (i + 3) for i, t in enumerate(prefix)) + 5 * len(prefix)) % VOCAB


def greedy_continuation(prefix: list[int], steps: int) -> list[int]:
    out = list(prefix)
    for _ in range(steps):
        out.append(next_token(out))
    return out[len(prefix) :]


def run_greedy_round(prompt: list[int], parents: list[int], tokens: list[int]):
    """Score a drafted tree with the toy target and verify it greedily."""
    argmax = [next_token(prompt + [tokens[a] for a in reversed(ancestors(parents, i))]) for i in range(len(parents))]
    parents_t, num_nodes = padded_batch([parents], width=len(parents))
    layout = build_tree(parents_t, torch.tensor([len(prompt)]), num_nodes)
    return verify_greedy(torch.tensor([tokens]), torch.tensor([argmax]), layout, num_nodes)


def test_verify_greedy_reproduces_greedy_sequence():
    prompt = [4, 2, 9]
    root = next_token(prompt)  # the last sampled token, not yet in the cache
    good = greedy_continuation(prompt + [root], 3)
    # Node 1 is a wrong first guess; node 2 is right, with a wrong (3) and a right (4)
    # second guess; node 4 continues with the right third token (5) beside a wrong one (6).
    parents = [-1, 0, 0, 2, 2, 4, 4]
    tokens = [root, (good[0] + 1) % VOCAB, good[0], (good[1] + 2) % VOCAB, good[1], good[2], (good[2] + 1) % VOCAB]
    result = run_greedy_round(prompt, parents, tokens)

    assert result.accept_len.tolist() == [3]
    assert result.accepted_nodes[0].tolist() == [0, 2, 4, 5, -1, -1, -1]
    produced = [tokens[n] for n in result.accepted_nodes[0, 1:4].tolist()] + result.bonus_token.tolist()
    assert produced == greedy_continuation(prompt + [root], 4)


def test_verify_greedy_accepts_nothing_when_no_child_matches():
    prompt = [1, 1]
    root = next_token(prompt)
    wrong = (next_token(prompt + [root]) + 1) % VOCAB
    result = run_greedy_round(prompt, [-1, 0, 0, 1], [root, wrong, wrong, 3])
    assert result.accept_len.tolist() == [0]
    assert result.accepted_nodes[0].tolist() == [0, -1, -1, -1]
    assert result.bonus_token.tolist() == greedy_continuation(prompt + [root], 1)


def test_verify_greedy_takes_the_first_of_duplicate_siblings():
    prompt = [3]
    root = next_token(prompt)
    good = greedy_continuation(prompt + [root], 2)
    result = run_greedy_round(prompt, [-1, 0, 0, 2], [root, good[0], good[0], good[1]])
    assert result.accepted_nodes[0].tolist() == [0, 1, -1, -1]
    assert result.bonus_token.tolist() == [good[1]]


def test_processed_probs_temperature_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    assert torch.allclose(processed_probs(logits, 0.5), torch.softmax(logits / 0.5, -1))

    top2 = processed_probs(logits, 1.0, top_k=2)
    assert (top2[0, 2:] == 0).all()
    assert torch.allclose(top2[0, :2], torch.softmax(logits[0, :2], -1))

    full = torch.softmax(logits, -1)[0]
    # Mass of the top two is below 0.85, so the third token is needed as well.
    assert full[:2].sum() < 0.85 < full[:3].sum()
    nucleus = processed_probs(logits, 1.0, top_p=0.85)
    assert (nucleus[0, 3:] == 0).all() and (nucleus[0, :3] > 0).all()
    assert torch.allclose(nucleus.sum(-1), torch.ones(1))


def test_processed_probs_per_request_parameters():
    logits = torch.randn(2, 3, 7)
    probs = processed_probs(logits, torch.tensor([1.0, 2.0]), torch.tensor([1, 0]), torch.tensor([1.0, 1.0]))
    assert ((probs[0] > 0).sum(-1) == 1).all()
    assert torch.allclose(probs[1], torch.softmax(logits[1] / 2.0, -1))
    with pytest.raises(ValueError):
        processed_probs(logits, 0.0)


def test_compact_kv_moves_exactly_the_accepted_slots():
    # cache [B=2, H=1, S=10, D=1] holding each slot's own index (+100 for request 1).
    cache = torch.arange(10.0).repeat(2, 1, 1).unsqueeze(-1).clone()
    cache[1] += 100
    accepted = torch.tensor([[0, 2, 5, -1], [0, 1, -1, -1]])
    compact_kv(cache, torch.tensor([3, 1]), accepted, torch.tensor([2, 1]))
    # Request 0: slots 3+2 -> 4 and 3+5 -> 5; request 1: slot 1+1 -> 2 (already there).
    assert cache[0, 0, :, 0].tolist() == [0, 1, 2, 3, 5, 8, 6, 7, 8, 9]
    assert cache[1, 0, :, 0].tolist() == [100 + s for s in range(10)]


def test_compact_kv_moves_every_leading_dimension_of_a_layer_view():
    cache = torch.randn(3, 2, 2, 4, 12, 8)  # [layers, K/V, B, H, S, D]
    before = cache.clone()
    compact_kv(cache[1], torch.tensor([2, 0]), torch.tensor([[0, 3, 4], [0, -1, -1]]), torch.tensor([2, 0]))
    assert torch.equal(cache[1, :, 0, :, 3], before[1, :, 0, :, 5])
    assert torch.equal(cache[1, :, 0, :, 4], before[1, :, 0, :, 6])
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[[3, 4]] = False
    assert torch.equal(cache[1, :, 0, :, untouched], before[1, :, 0, :, untouched])
    assert torch.equal(cache[1, :, 1], before[1, :, 1])
    assert torch.equal(cache[0], before[0]) and torch.equal(cache[2], before[2])


def test_unknown_backend_is_rejected():
    parents, num_nodes = padded_batch([HAND_TREE], width=6)
    with pytest.raises(ValueError):
        build_tree(parents, torch.tensor([0]), num_nodes, backend="cuda")


def full_sort_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Oracle: top-p over a full sort of each row."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    drop_sorted = sorted_probs.cumsum(-1) - sorted_probs >= top_p
    drop_sorted[..., 0] = False
    kept = probs.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), 0.0)
    return kept / kept.sum(-1, keepdim=True)


@pytest.mark.parametrize("spread", [0.1, 5.0])
def test_processed_probs_top_p_equals_a_full_sort(spread):
    # A flat row (spread 0.1) needs ~1800 of 2000 tokens: the sort window must widen.
    logits = torch.randn(3, 2000, generator=torch.Generator().manual_seed(5)) * spread
    out = processed_probs(logits, 1.0, top_p=0.9)
    assert torch.equal(out, full_sort_nucleus(torch.softmax(logits, -1), 0.9))
    if spread < 1:
        assert ((out > 0).sum(-1) > 1000).all()
