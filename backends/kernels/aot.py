"""Ahead-of-time compilation of the tree-verify kernels for a GPU target.

Compiling needs no GPU, only Triton's bundled toolchain (ptxas for CUDA):
``compile_kernels(GPUTarget("cuda", 90, 32))`` returns each kernel's
compiled form with its ``asm`` (ttir, ttgir, llir, ptx, cubin).
Run it in a process without ``TRITON_INTERPRET=1``: interpreted kernels
cannot be compiled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

I64 = "i64"
PTR_I64 = "*i64"


@dataclass(frozen=True)
class KernelSpec:
    """One specialization of a kernel: argument types and constexpr values."""

    name: str
    signature: dict[str, str]
    constexprs: dict[str, object] = field(default_factory=dict)
    num_warps: int = 4


def kernel_specs(max_nodes: int = 64, head_dim: int = 64, probs_dtype: str = "fp32") -> list[KernelSpec]:
    """The four kernels, specialized for trees of ``max_nodes`` and the given head size."""
    from backends.kernels.probs import PROB_SCALE
    from backends.kernels.triton_tree import block_size
    from backends.kernels.triton_verify import SAMPLING_WARPS, VOCAB_TILE

    block_n = block_size(max_nodes)
    return [
        KernelSpec(
            "build_tree_kernel",
            {**dict.fromkeys(["parents_ptr", "seq_lens_ptr", "num_nodes_ptr"], PTR_I64),
             "mask_ptr": "*i1",
             **dict.fromkeys(["position_ptr", "depth_ptr", "first_child_ptr", "next_sibling_ptr"], PTR_I64),
             "N": I64, "BLOCK_N": "constexpr"},
            {"BLOCK_N": block_n},
        ),
        KernelSpec(
            "verify_greedy_kernel",
            {**dict.fromkeys(["tokens_ptr", "argmax_ptr", "first_child_ptr", "next_sibling_ptr",
                              "accepted_ptr", "accept_len_ptr", "bonus_ptr"], PTR_I64),
             "N": I64},
        ),
        KernelSpec(
            "verify_sampling_kernel",
            {"tokens_ptr": PTR_I64, "probs_ptr": f"*{probs_dtype}",
             "uniforms_ptr": "*fp32", "bonus_uniforms_ptr": "*fp32",
             **dict.fromkeys(["first_child_ptr", "next_sibling_ptr", "accepted_ptr",
                              "accept_len_ptr", "bonus_ptr"], PTR_I64),
             **dict.fromkeys(["N", "V", "stride_pb", "stride_pn"], I64),
             "SCALE": "constexpr", "BLOCK_N": "constexpr", "BLOCK_V": "constexpr"},
            {"SCALE": PROB_SCALE, "BLOCK_N": block_n, "BLOCK_V": VOCAB_TILE},
            num_warps=SAMPLING_WARPS,
        ),
        KernelSpec(
            "compact_kv_kernel",
            {"cache_ptr": "*bf16", **dict.fromkeys(["seq_lens_ptr", "accepted_ptr", "accept_len_ptr"], PTR_I64),
             **dict.fromkeys(["N", "H", "D", "stride_l", "stride_b", "stride_h", "stride_s", "stride_d"], I64),
             "BLOCK_D": "constexpr"},
            {"BLOCK_D": head_dim},
        ),
    ]


def _kernel(name: str):
    from backends.kernels import triton_compact, triton_tree, triton_verify

    for module in (triton_tree, triton_verify, triton_compact):
        if hasattr(module, name):
            return getattr(module, name)
    raise KeyError(name)


def compile_kernels(target, specs: list[KernelSpec] | None = None) -> dict[str, object]:
    """Compile every kernel spec for ``target`` (a ``triton.backends.compiler.GPUTarget``)."""
    import triton
    from triton.compiler import ASTSource

    compiled = {}
    for spec in specs or kernel_specs():
        source = ASTSource(_kernel(spec.name), spec.signature, spec.constexprs)
        compiled[spec.name] = triton.compile(source, target=target, options={"num_warps": spec.num_warps})
    return compiled
