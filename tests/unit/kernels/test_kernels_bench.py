"""bench/kernels.py, the kernels against the reference on a GPU, runs end to end on Triton's CPU
interpreter: every kernel agrees on every random batch, and every kernel is timed on both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # Triton's interpreter in a process of its own

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]


def test_the_kernels_benchmark_checks_agreement_and_times_both_backends(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernels.py"), "--device", "cpu", "--quick",
         "--seeds", "3", "--repeats", "2", "--json", str(out)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["agreement"] == {
        name: [3, 3]
        for name in ("build_tree", "verify_greedy", "verify_sampling V=64", "verify_sampling V=5", "compact_kv")
    }
    timed = [(row["kernel"], row["shape"]) for row in figures["timings"]]
    assert timed == [("build_tree", "B=2 N=8"), ("verify_greedy", "B=2 N=8"), ("compact_kv", "B=2 N=8"),
                     ("verify_sampling", "B=2 N=8 V=64")]
    assert all(row["torch"] > 0 and row["triton"] > 0 for row in figures["timings"])


def test_without_a_gpu_or_the_interpreter_it_says_what_to_set() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "kernels.py"), "--device", "cpu"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert run.returncode == 2 and "TRITON_INTERPRET=1" in run.stderr
