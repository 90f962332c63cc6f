"""vLLM's per-request histograms, as the serving app records a finished request."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from backends.serving import VllmMetrics

LABELS = {"model_name": "M", "engine": "0"}


def finished(metrics: VllmMetrics, tokens: int, gaps: list[float]) -> None:
    metrics.observe_finished(prompt_tokens=4, generation_tokens=tokens, finish_reason="stop",
                             e2e_seconds=1.0, ttft_seconds=0.1, inter_token_seconds=gaps)


def test_time_per_output_token_is_the_decode_time_over_the_tokens_after_the_first() -> None:
    registry = CollectorRegistry()
    metrics = VllmMetrics(registry, "M", num_speculative_tokens=2)
    # a speculative answer: 7 tokens in 3 steps after the first, one gap a step
    finished(metrics, 7, [0.03, 0.06, 0.03])
    # one token: no decode time, and vLLM observes 0
    finished(metrics, 1, [])
    name = "vllm:request_time_per_output_token_seconds"
    assert registry.get_sample_value(f"{name}_count", LABELS) == 2
    assert registry.get_sample_value(f"{name}_sum", LABELS) == pytest.approx(0.12 / 6)
    assert registry.get_sample_value(f"{name}_bucket", {**LABELS, "le": "0.01"}) == 1
    assert registry.get_sample_value(f"{name}_bucket", {**LABELS, "le": "0.025"}) == 2
    # the step gaps are what inter-token latency counts, as vLLM's per engine step
    assert registry.get_sample_value("vllm:inter_token_latency_seconds_count", LABELS) == 3
