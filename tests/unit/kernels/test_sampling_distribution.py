"""verify_sampling reproduces the target distribution (chi-square goodness of fit).

One draft tree is verified many times with fresh coins (torch reference, one
batched call). The first two output tokens are compared with the target's
joint distribution: x1 ~ p_root, and when x1 is a drafted child c of the root,
x2 ~ p_c. The p-value is the exact chi-square tail, Q(df/2, stat/2), from
torch.special.gammaincc; the test fails when p < 1e-3.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from backends.kernels import build_tree, processed_probs, verify_sampling
from tests.unit.kernels.trees import padded_batch

pytestmark = pytest.mark.slow  # torch

VOCAB = 6
TRIALS = 20_000
MIN_P_VALUE = 1e-3
# Root children: node 1 (token 0), node 2 (token 3), node 3 (token 0 again);
# node 1 has children 4, 5 and node 2 has child 6.
PARENTS = [-1, 0, 0, 0, 1, 1, 2]
TOKENS = [5, 0, 3, 0, 2, 4, 1]


def target_probs() -> torch.Tensor:
    """Per-node target rows with temperature and top-k applied (zeros included)."""
    logits = torch.randn(len(PARENTS), VOCAB, generator=torch.Generator().manual_seed(3)) * 1.5
    probs = processed_probs(logits, temperature=0.9, top_k=4)
    assert (probs == 0).any(dim=-1).all()
    return probs


def first_child_with_token(token: int) -> int | None:
    return next((c for c in range(1, len(PARENTS)) if PARENTS[c] == 0 and TOKENS[c] == token), None)


def expected_joint(probs: torch.Tensor) -> dict[tuple[int, int | None], float]:
    """Target probability of each (x1, x2) outcome; x2 is None when x1 is not drafted."""
    joint = {}
    for x1 in range(VOCAB):
        node = first_child_with_token(x1)
        if node is None:
            joint[(x1, None)] = float(probs[0, x1])
            continue
        for x2 in range(VOCAB):
            joint[(x1, x2)] = float(probs[0, x1] * probs[node, x2])
    return joint


def observed_joint(probs: torch.Tensor, seed: int) -> Counter:
    generator = torch.Generator().manual_seed(seed)
    parents, num_nodes = padded_batch([PARENTS] * TRIALS, width=len(PARENTS))
    layout = build_tree(parents, torch.zeros(TRIALS, dtype=torch.long), num_nodes)
    result = verify_sampling(
        torch.tensor([TOKENS] * TRIALS),
        probs.expand(TRIALS, -1, -1),
        layout,
        num_nodes,
        torch.rand(TRIALS, len(PARENTS), generator=generator),
        torch.rand(TRIALS, generator=generator),
        backend="torch",
    )
    counts = Counter()
    for path, length, bonus in zip(
        result.accepted_nodes.tolist(), result.accept_len.tolist(), result.bonus_token.tolist(), strict=True
    ):
        produced = [TOKENS[node] for node in path[1 : length + 1]] + [bonus]
        counts[(produced[0], produced[1] if length >= 1 else None)] += 1
    return counts


def chi_square_p_value(counts: Counter, expected: dict, trials: int) -> float:
    """Pearson chi-square over outcomes, pooling those expected fewer than 5 times."""
    assert set(counts) <= set(expected), f"impossible outcomes: {set(counts) - set(expected)}"
    stat, cells, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for outcome, prob in expected.items():
        if prob == 0:
            assert counts[outcome] == 0, f"outcome {outcome} has target probability 0"
            continue
        if prob * trials < 5:
            pooled_obs, pooled_exp = pooled_obs + counts[outcome], pooled_exp + prob * trials
            continue
        stat += (counts[outcome] - prob * trials) ** 2 / (prob * trials)
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    dof = torch.tensor(cells - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, torch.tensor(stat, dtype=torch.float64) / 2))


def test_first_two_tokens_follow_the_target_distribution():
    probs = target_probs()
    counts = observed_joint(probs, seed=11)
    assert sum(counts.values()) == TRIALS
    assert chi_square_p_value(counts, expected_joint(probs), TRIALS) > MIN_P_VALUE


def test_the_check_rejects_a_slightly_different_distribution():
    """Power check: the same counts fail against a root distribution moved by 0.02."""
    probs = target_probs()
    counts = observed_joint(probs, seed=11)
    largest, second = probs[0].topk(2).indices.tolist()
    shifted = probs.clone()
    shifted[0, largest] -= 0.02
    shifted[0, second] += 0.02
    assert chi_square_p_value(counts, expected_joint(shifted), TRIALS) < MIN_P_VALUE
