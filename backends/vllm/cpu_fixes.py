"""A vLLM plugin that fixes sampled speculative decoding in vLLM 0.32's CPU build.

vLLM's CPU build replaces its Triton kernels with C++ ones
(`vllm/utils/cpu_triton_utils.py`, registered by the CPU platform). The
replacement of the rejection sampler's `expand_kernel` converts its output
tensor to int64 before writing into it; for a float output (the per-request
temperatures spread over the draft tokens) that conversion is a copy, so the
results are thrown away and the target's logits are divided by uninitialised
memory. Every sampled request a speculative pool verifies then answers
nonsense and accepts no draft token; greedy requests never reach that kernel.

`register` (a `vllm.general_plugins` entry point, run in every vLLM process
before the platform registers its kernels) points the CPU build at an
expansion written in torch, correct for every dtype. It changes nothing when
vLLM runs with Triton (a GPU, or Triton's CPU backend).
"""

from __future__ import annotations

from typing import Any


def expand(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: int, replace_to: int,
           MAX_NUM_TOKENS: int | None = None) -> None:
    """`output[start(i):end(i)] = input_val[i]` for each request i (its tokens'
    span from the cumulative counts), `replace_from` read as `replace_to`."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    if MAX_NUM_TOKENS is not None:
        counts = counts.clamp(max=MAX_NUM_TOKENS)  # the kernel writes at most this many a request
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    positions = torch.repeat_interleave(starts, counts) + _offsets(counts)
    output[positions] = torch.repeat_interleave(values, counts).to(output.dtype)


def _offsets(counts: Any) -> Any:
    """0, 1, ..., counts[i] - 1 for each i, concatenated."""
    import torch

    total = int(counts.sum())
    firsts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return torch.arange(total, dtype=torch.int64) - firsts


def register() -> None:
    """Swap the CPU build's expansion for `expand`; idempotent, and a no-op
    where the build has no such module."""
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return
    if hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        cpu_triton_utils._expand_kernel_impl = expand  # the name the CPU platform registers from
