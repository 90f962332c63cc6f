"""The Triton kernels: bit-exact on the CPU interpreter, and compiled for sm_90a.

``triton.jit`` chooses interpreter or compiler when a function is decorated,
Triton's own library functions included, so the interpreter run needs a
process that sets TRITON_INTERPRET=1 before importing triton, and the
ahead-of-time compilation needs one that does not set it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # torch and Triton in processes of their own

pytest.importorskip("triton")

REPO_ROOT = Path(__file__).resolve().parents[3]
CASES = Path(__file__).with_name("interpreted_cases.py")
CASE_COUNT = 9


def run_python(args: list[str], interpret: bool, cache_dir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache_dir)  # compile for real, not from an earlier run's cache
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240
    )


def test_interpreted_triton_kernels_match_the_reference_bit_for_bit(tmp_path):
    proc = run_python(["-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider"], True, tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{CASE_COUNT} passed" in proc.stdout, proc.stdout[-2000:]


AOT_SCRIPT = """
import json
from triton.backends.compiler import GPUTarget
from backends.kernels.aot import compile_kernels
compiled = compile_kernels(GPUTarget("cuda", 90, 32))
print(json.dumps({
    name: {
        "targets": [l.split()[1] for l in k.asm["ptx"].splitlines() if l.startswith(".target")],
        "entry": f".entry {name}(" in k.asm["ptx"],
        "cubin_magic": k.asm["cubin"][:4].hex(),
        "cubin_bytes": len(k.asm["cubin"]),
    }
    for name, k in compiled.items()
}))
"""


def test_every_kernel_compiles_ahead_of_time_for_sm_90a(tmp_path):
    proc = run_python(["-c", AOT_SCRIPT], False, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    compiled = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(compiled) == {"build_tree_kernel", "verify_greedy_kernel", "verify_sampling_kernel", "compact_kv_kernel"}
    for name, artifact in compiled.items():
        assert artifact["targets"] == ["sm_90a"], name
        assert artifact["entry"], name
        assert artifact["cubin_magic"] == b"\x7fELF".hex(), name
        assert artifact["cubin_bytes"] > 1000, name
