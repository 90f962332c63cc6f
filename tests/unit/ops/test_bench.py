"""`specgate bench` and `specgate baseline record` against fake vLLM servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from gateway.control.baseline import read_baseline
from specgate.ops.bench import plot, run_bench
from specgate.ops.measure import Sample, percentile, summarize
from specgate.ops.prompts import builtin_prompts, load_prompts
from tests.fakes.vllm import FakeVllm

ROOT = Path(__file__).resolve().parents[3]


def test_percentiles_and_summary_on_known_samples():
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50.0, 95.0, 99.0)
    assert percentile([], 50) is None
    samples = [Sample("t", 1, True, e2e_s=2.0, ttft_s=0.5, tpot_s=0.01 * i, output_tokens=10, pool="standard")
               for i in range(1, 5)] + [Sample("t", 1, False, e2e_s=0.1, error="http_503")]
    summary = summarize(samples, wall_s=4.0)
    assert summary["errors"] == 1 and summary["requests_per_s"] == 1.0
    assert summary["output_tokens_per_s"] == 10.0
    assert summary["tpot_s"]["p50"] == 0.02 and summary["pools"] == {"standard": 4}


def test_prompt_files(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi", "max_tokens": 5}\n\n{"messages": [{"role": "user", "content": "x"}]}\n')
    prompts = load_prompts(path)
    assert [p.path for p in prompts] == ["/v1/completions", "/v1/chat/completions"]
    path.write_text('{"temperature": 1}\n')
    with pytest.raises(ValueError, match="p.jsonl:1"):
        load_prompts(path)
    assert {p.domain for p in builtin_prompts()} >= {"chat", "code", "math", "summarization"}


@pytest.mark.slow  # seconds of wall time: it runs in `make test`, not `make check`
def test_bench_interleaves_targets_and_times_streams(tmp_path):
    with FakeVllm(model="m") as fast, FakeVllm(model="m", kind="standard") as slow:
        fast.script(text="a b c d e f g h", chunks=8, delay=0.002)
        slow.script(text="a b c d e f g h", chunks=8, delay=0.02)
        order: list[str] = []
        report = asyncio.run(run_bench([fast.url, slow.url], [1, 4], 8, builtin_prompts(), model="m",
                                       max_tokens=16, on_done=lambda s: order.append(s.target)))
    rows = {(r["target"], r["concurrency"]): r for r in report["results"]}
    assert len(rows) == 4 and all(r["errors"] == 0 and r["requests"] == 8 for r in rows.values())
    assert rows[fast.url, 1]["tpot_s"]["p50"] < rows[slow.url, 1]["tpot_s"]["p50"]
    assert all(rows[key]["ttft_s"]["p50"] is not None for key in rows)
    # interleaved: the targets alternate batch by batch instead of running back to back
    switches = sum(1 for a, b in pairwise(order) if a != b)
    assert switches >= 8
    pngs = plot(report, tmp_path)
    assert all(p.stat().st_size > 1000 for p in pngs)


@pytest.mark.slow
def test_bench_and_baseline_commands(tmp_path):
    with FakeVllm(model="fake-model") as fake:
        out = tmp_path / "bench"
        bench = subprocess.run([sys.executable, "-m", "specgate.cli", "bench", "--url", fake.url,
                                "--concurrency", "1,2", "--requests", "4", "--out", str(out)],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert bench.returncode == 0, bench.stderr
        results = json.loads((out / "results.json").read_text())
        assert results["model"] == "fake-model" and len(results["results"]) == 2
        assert (out / "tpot.png").exists() and (out / "throughput.png").exists()
        baseline_path = tmp_path / "baseline.json"
        record = subprocess.run([sys.executable, "-m", "specgate.cli", "baseline", "record", "--url", fake.url,
                                 "--requests", "4", "--out", str(baseline_path)],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert record.returncode == 0, record.stderr
    baseline = read_baseline(baseline_path)
    assert baseline.requests == 4 and baseline.e2e_s.p95 >= baseline.e2e_s.p50 > 0
