"""Linear layers with their weights packed once for oneDNN (CPU).

PyTorch's default CPU matmul is tuned for many rows: a decoding step of one
token reads the weights at about half the memory bandwidth, and scoring a
draft tree of 2-12 tokens costs 1.2-1.5x as much again. oneDNN with the
weight reordered once into its blocked layout decodes one token about twice
as fast, and its cost grows slowly with the tokens scored, which is the
regime tree verification needs (docs/benchmarks/engine.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def packing_available() -> bool:
    """This torch build has oneDNN and the weight-packing operators."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def packable_dtypes() -> set[torch.dtype]:
    """The weight dtypes oneDNN packs on this CPU: float32 wherever packing is
    available, bfloat16 only with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT."""
    if not packing_available():
        return set()
    return {dtype for dtype in PACKABLE_DTYPES if _packs(dtype)}


def _packs(dtype: torch.dtype) -> bool:
    try:
        PackedLinear(nn.Linear(8, 8, dtype=dtype))(torch.zeros(1, 8, dtype=dtype))
    except RuntimeError:
        return False
    return True


class PackedLinear(nn.Module):
    """`nn.Linear` for inference, computed by oneDNN from a packed weight."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linear_layers(model: Any) -> int:
    """Replace every CPU `nn.Linear` of `model` whose dtype this CPU packs
    (`packable_dtypes`) by a `PackedLinear`, in place, for inference only.
    Returns how many were replaced."""
    dtypes = packable_dtypes()
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (type(child) is nn.Linear and child.weight.device.type == "cpu"
                    and child.weight.dtype in dtypes):
                setattr(parent, name, PackedLinear(child))
                replaced += 1
    return replaced
