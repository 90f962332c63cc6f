"""oneDNN-packed linear layers compute what nn.Linear computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from backends.engine.packing import PackedLinear, pack_linear_layers, packable_dtypes, packing_available

pytestmark = [pytest.mark.slow,  # torch
              pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packing")]


def test_packed_layers_match_nn_linear_for_any_number_of_rows():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32, bias=False)).eval()
    inputs = [torch.randn(1, rows, 64) for rows in (1, 2, 7, 16)]
    with torch.inference_mode():
        expected = [model(x) for x in inputs]
        assert pack_linear_layers(model) == 2
        assert all(isinstance(model[i], PackedLinear) for i in (0, 2))
        for x, want in zip(inputs, expected, strict=True):
            got = model(x)
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_float32_packs_and_bfloat16_packs_where_the_cpu_can():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).double(), nn.Linear(8, 8).bfloat16())
    bf16 = torch.bfloat16 in packable_dtypes()
    assert pack_linear_layers(model) == (2 if bf16 else 1)
    assert [type(layer) for layer in model] == [PackedLinear, nn.Linear, PackedLinear if bf16 else nn.Linear]
    with torch.inference_mode():
        assert model[2](torch.ones(1, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
