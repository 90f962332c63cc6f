"""`specgate tune` with a launcher that starts the pool simulator instead of vLLM."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from backends.sim.model import SimParams, acceptance, speedup
from specgate.ops.prompts import builtin_prompts
from specgate.ops.tune import candidates, sweep, table
from tests.fakes.process import free_port, spawn_module, wait_until_ok

ROOT = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def sim_launcher(spec_config: Mapping[str, Any] | None, port: int) -> Iterator[str]:
    """The simulator as the profile: standard when `spec_config` is None, else
    speculative with the candidate's draft length (the port is picked free here)."""
    port = free_port()
    args = ["sim", "--port", str(port), "--output-tokens", "48", "--seed", "1", "--model", "sim"]
    if spec_config is None:
        args += ["--kind", "standard"]
    else:
        args += ["--kind", "speculative", "--num-speculative-tokens", str(spec_config["num_speculative_tokens"])]
    process = spawn_module("specgate.cli", *args)
    try:
        wait_until_ok(f"http://127.0.0.1:{port}/health", process, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_candidates_cover_every_combination():
    assert candidates([2, 4]) == [{"num_speculative_tokens": 2}, {"num_speculative_tokens": 4}]
    assert candidates([2], [3, 5]) == [{"num_speculative_tokens": 2, "prompt_lookup_max": 3},
                                       {"num_speculative_tokens": 2, "prompt_lookup_max": 5}]


@pytest.mark.slow
def test_tune_recommends_the_draft_length_the_model_says_is_fastest():
    values = [1, 5]
    predicted = {k: speedup(acceptance("chat", 0.0), 1, SimParams(num_speculative_tokens=k)) for k in values}
    result = sweep(sim_launcher, candidates(values), builtin_prompts(), requests=4, concurrency=2,
                   max_tokens=48, port=0, progress=lambda line: None)
    rows = {row["config"]["num_speculative_tokens"]: row for row in result["candidates"]}
    assert result["model"] == "sim" and all(row["errors"] == 0 for row in rows.values())
    assert result["recommended"] == {"num_speculative_tokens": max(predicted, key=predicted.get)}
    assert all(row["speedup"] > 1.2 for row in rows.values())  # the simulated GPU pool beats standard at batch <= 2
    # accepted / drafted falls as the chain grows: (a + ... + a^g) / g
    assert 0.6 < rows[1]["acceptance"] <= 0.99 and 0.3 < rows[5]["acceptance"] < rows[1]["acceptance"]
    assert "| num_speculative_tokens=5 |" in table(result)


@pytest.mark.slow
def test_tune_rejects_a_profile_without_speculation():
    result = subprocess.run([sys.executable, "-m", "specgate.cli", "tune", "--profile", "standard"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "not a speculative profile" in result.stderr
    result = subprocess.run([sys.executable, "-m", "specgate.cli", "tune", "--profile", "speculative-eagle3",
                             "--lookup-max", "3"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "n-gram profiles only" in result.stderr
