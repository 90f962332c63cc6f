"""One answer's speculative acceptance, as vLLM reports it per request.

vLLM 0.32 started with `--per-request-spec-decode-metrics summary` counts,
for each sequence, how many draft tokens every verify step accepted
(`RequestSpecDecodeMetrics` in `vllm/v1/metrics/stats.py`) and puts the
summary in the response as `metrics.speculative_decoding`: in a whole
response, and in a stream's usage chunk (only sent with
`stream_options.include_usage`). A step that drafted nothing is not a
verify step and is not counted.
"""

from __future__ import annotations

from typing import Any


class AcceptanceTally:
    """The verify steps of one answer: a histogram of accepted drafts."""

    def __init__(self, num_spec_tokens: int) -> None:
        self.num_spec_tokens = num_spec_tokens
        self.histogram = [0] * (num_spec_tokens + 1)
        self.num_draft_tokens = 0

    def observe(self, drafted: int, accepted: int) -> None:
        """One step that proposed `drafted` tokens of which `accepted` matched."""
        if drafted <= 0:
            return
        self.histogram[max(0, min(accepted, drafted, self.num_spec_tokens))] += 1
        self.num_draft_tokens += drafted

    def summary(self) -> dict[str, Any]:
        """vLLM's `SpeculativeDecodingMetrics`, fields in its order."""
        steps = sum(self.histogram)
        accepted = sum(j * count for j, count in enumerate(self.histogram))
        return {
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            "acceptance_histogram": list(self.histogram),
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": self.num_draft_tokens,
            "num_spec_tokens": self.num_spec_tokens,
        }


PER_REQUEST_TIMING = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
                      "tokens_per_second")


def whole_metrics(metrics: dict[str, Any] | None) -> dict[str, Any] | None:
    """vLLM's `PerRequestMetrics` as a whole response dumps it: timing fields
    `null` (they need `--enable-per-request-metrics`), the detailed per-step
    arrays of `speculative_decoding` `null` at the `summary` level."""
    if metrics is None:
        return None
    full: dict[str, Any] = dict.fromkeys(PER_REQUEST_TIMING)
    spec = metrics.get("speculative_decoding")
    full["speculative_decoding"] = None if spec is None else {
        **spec, "per_step_accepted": spec.get("per_step_accepted"), "per_step_drafted": spec.get("per_step_drafted")}
    return full
