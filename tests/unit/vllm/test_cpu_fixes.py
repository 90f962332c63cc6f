"""The plugin that fixes vLLM CPU's expansion of per-request values to draft tokens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

torch = pytest.importorskip("torch")

from backends.vllm.cpu_fixes import expand, register  # noqa: E402 - only once torch is known to be installed

pytestmark = pytest.mark.slow  # torch and vLLM


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_each_request_value_fills_its_tokens_span(dtype):
    values = torch.tensor([0.7, 1.0, 0.0], dtype=torch.float32).to(dtype)
    ends = torch.tensor([2, 5, 6], dtype=torch.int32)
    output = torch.full((6,), -123, dtype=dtype)
    expand(output, values, ends, replace_from=0, replace_to=1, MAX_NUM_TOKENS=8)
    expected = torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.0], dtype=torch.float32).to(dtype)
    if dtype.is_floating_point:
        assert torch.allclose(output, expected)
    else:  # 0.7 truncates to 0, which is then replaced by 1
        assert output.tolist() == [1, 1, 1, 1, 1, 1]


def test_a_request_with_no_tokens_writes_nothing():
    output = torch.full((3,), -1.0)
    expand(output, torch.tensor([2.0, 3.0, 4.0]), torch.tensor([1, 1, 3]), 0, 0)
    assert output.tolist() == [2.0, 4.0, 4.0]


def test_the_cpu_build_is_pointed_at_the_fix_through_vllms_plugin_group():
    cpu_triton_utils = pytest.importorskip("vllm.utils.cpu_triton_utils")
    names = {e.value for e in entry_points(group="vllm.general_plugins")}
    assert "backends.vllm.cpu_fixes:register" in names
    original = cpu_triton_utils._expand_kernel_impl
    try:
        register()
        register()  # vLLM loads plugins once a process, possibly in several processes
        assert cpu_triton_utils._expand_kernel_impl is expand
    finally:
        cpu_triton_utils._expand_kernel_impl = original


# vLLM's own expansion runs in its C++ ops, built once per instruction set
# (`_C`: AVX-512 with BF16, `_C_AVX512`, `_C_AVX2`). Importing `vllm._custom_ops`
# loads the build vLLM picks for this CPU; importing one build by name would
# kill the whole test run with SIGILL on a CPU without its instructions. The
# child process keeps even a wrong pick to this one test.
_VLLM_EXPANSION = """
import json, torch
import vllm._custom_ops  # noqa: F401 - loads the C++ ops built for this CPU, as vLLM does
from vllm.utils import cpu_triton_utils
ints = torch.full((2,), -123, dtype=torch.int64)
cpu_triton_utils._expand_kernel_impl(ints, torch.tensor([5]), torch.tensor([2]), 0, 0)
floats = torch.full((2,), -123.0)
cpu_triton_utils._expand_kernel_impl(floats, torch.tensor([0.7]), torch.tensor([2]), 0, 0)
print(json.dumps({"ints": ints.tolist(), "floats": floats.tolist()}))
"""


def test_vllm_cpus_own_expansion_loses_float_values_and_keeps_integers():
    """What the fix is for: if the float case starts passing, vLLM fixed it and the plugin can go."""
    pytest.importorskip("vllm.utils.cpu_triton_utils")
    done = subprocess.run([sys.executable, "-c", _VLLM_EXPANSION], capture_output=True, text=True,
                          env={**os.environ, "VLLM_PLUGINS": "none"})
    if done.returncode < 0:
        pytest.fail(f"vLLM's C++ ops died with {signal.Signals(-done.returncode).name} on this CPU "
                    f"(the build vLLM picked for it uses an instruction the CPU lacks):\n{done.stderr[-2000:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"ints": [5, 5], "floats": [-123.0, -123.0]}
