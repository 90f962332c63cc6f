"""Tree-verify kernels for speculative decoding with draft trees.

Each entry point runs the Triton kernel when its inputs are CUDA tensors (or
when called with ``backend="triton"``, e.g. on CPU under ``TRITON_INTERPRET=1``)
and the plain torch reference otherwise. Both give identical results.
Triton is imported only when a Triton kernel is actually used.
"""

from __future__ import annotations

import torch

from backends.kernels.probs import processed_probs
from backends.kernels.reference import (
    build_tree_reference,
    compact_kv_reference,
    verify_greedy_reference,
    verify_sampling_reference,
)
from backends.kernels.types import TreeLayout, VerifyResult

__all__ = [
    "TreeLayout",
    "VerifyResult",
    "build_tree",
    "compact_kv",
    "processed_probs",
    "verify_greedy",
    "verify_sampling",
]

BACKENDS = ("auto", "torch", "triton")


def _use_triton(backend: str, tensor: torch.Tensor) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return tensor.is_cuda
    return backend == "triton"


def build_tree(
    parents: torch.Tensor, seq_lens: torch.Tensor, num_nodes: torch.Tensor, *, backend: str = "auto"
) -> TreeLayout:
    """Attention mask, positions, depths and child/sibling links of a batch of draft trees."""
    if _use_triton(backend, parents):
        from backends.kernels.triton_tree import build_tree_triton

        return build_tree_triton(parents, seq_lens, num_nodes)
    return build_tree_reference(parents, seq_lens, num_nodes)


def verify_greedy(
    draft_tokens: torch.Tensor,
    target_argmax: torch.Tensor,
    layout: TreeLayout,
    num_nodes: torch.Tensor,
    *,
    backend: str = "auto",
) -> VerifyResult:
    """Longest root path whose tokens match the target's argmax, plus the bonus token."""
    if _use_triton(backend, draft_tokens):
        from backends.kernels.triton_verify import verify_greedy_triton

        return verify_greedy_triton(draft_tokens, target_argmax, layout, num_nodes)
    return verify_greedy_reference(draft_tokens, target_argmax, layout, num_nodes)


def verify_sampling(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    layout: TreeLayout,
    num_nodes: torch.Tensor,
    uniforms: torch.Tensor,
    bonus_uniforms: torch.Tensor,
    *,
    backend: str = "auto",
) -> VerifyResult:
    """Exact multi-draft rejection sampling down the tree; see docs/kernels.md."""
    if _use_triton(backend, draft_tokens):
        from backends.kernels.triton_verify import verify_sampling_triton

        return verify_sampling_triton(draft_tokens, target_probs, layout, num_nodes, uniforms, bonus_uniforms)
    return verify_sampling_reference(draft_tokens, target_probs, layout, num_nodes, uniforms, bonus_uniforms)


def compact_kv(
    cache: torch.Tensor,
    seq_lens: torch.Tensor,
    accepted_nodes: torch.Tensor,
    accept_len: torch.Tensor,
    *,
    backend: str = "auto",
) -> None:
    """In place, move the accepted path's KV entries to slots seq_lens+1 .. seq_lens+accept_len."""
    if _use_triton(backend, cache):
        from backends.kernels.triton_compact import compact_kv_triton

        compact_kv_triton(cache, seq_lens, accepted_nodes, accept_len)
        return
    compact_kv_reference(cache, seq_lens, accepted_nodes, accept_len)
