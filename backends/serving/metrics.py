"""vLLM V1's Prometheus metrics, with vLLM's names, labels and buckets.

Names and labels follow vLLM 0.32 (`vllm/v1/metrics/loggers.py`,
`vllm/v1/spec_decode/metrics.py`, `vllm/v1/metrics/buckets.py`): every series
carries `model_name` and `engine` (the engine index, "0"); counters are created
without the `_total` suffix, which prometheus_client appends on exposition, so
the scraped names are vLLM's (`vllm:spec_decode_num_drafts_total`, ...). As in
vLLM, the spec-decode counters exist only on a speculative server, with one
`position` series per speculative token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

# vllm/v1/metrics/buckets.py
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# vllm/v1/engine/__init__.py: FINISH_REASON_STRINGS
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class _Series:
    """Makes one engine's series: every metric carries `model_name` and `engine`."""

    def __init__(self, registry: CollectorRegistry, model_name: str, engine: str) -> None:
        self.registry = registry
        self.labels = ("model_name", "engine")
        self.values = (model_name, engine)

    def gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        Gauge(name, doc, self.labels, registry=self.registry).labels(*self.values).set_function(read)

    def counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, self.labels, registry=self.registry).labels(*self.values)

    def counters_by(self, name: str, doc: str, label: str, keys: Sequence[str]) -> dict[str, Counter]:
        """One counter with a further label, and its series for each of `keys`."""
        family = Counter(name, doc, (*self.labels, label), registry=self.registry)
        return {key: family.labels(*self.values, key) for key in keys}

    def histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, doc, self.labels, buckets=buckets, registry=self.registry).labels(*self.values)


class VllmMetrics:
    """The metrics one vLLM engine exports, in `registry`.

    Load accounting: `request_arrived` (waiting), `request_started` (waiting ->
    running), `request_left(started)`. `override_load` pins the exposed
    gauges to given values (tests drive a guard with it); `None` releases them.

    One step's or one request's observations and a scrape exclude each other,
    so a scrape never sees a step's draft tokens without its accepted tokens
    (the engine observes from its worker thread, scrapes run on the event loop).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        *,
        num_speculative_tokens: int | None = None,
        engine: str = "0",
    ) -> None:
        self.registry = registry
        self.num_speculative_tokens = num_speculative_tokens
        self.running = 0
        self.waiting = 0
        self._observing = threading.Lock()
        self._pinned: dict[str, int | None] = {"running": None, "waiting": None}
        series = _Series(registry, model_name, engine)
        self._add_load_gauges(series)
        self._add_request_metrics(series)
        self.spec_drafts = self.spec_draft_tokens = self.spec_accepted = None
        self.spec_accepted_per_pos: list = []
        if num_speculative_tokens is not None:
            self._add_spec_decode_counters(series, num_speculative_tokens)

    def _add_load_gauges(self, series: _Series) -> None:
        """The running/waiting gauges, read at scrape time (pinned values first)."""
        running, waiting = "vllm:num_requests_running", "vllm:num_requests_waiting"
        series.gauge(running, "Number of requests in model execution batches.", lambda: self._exposed("running"))
        series.gauge(waiting, "Number of requests waiting to be processed.", lambda: self._exposed("waiting"))

    def _add_request_metrics(self, series: _Series) -> None:
        """What every finished request adds: tokens, outcome, latencies."""
        self.prompt_tokens = series.counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = series.counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = series.counters_by(
            "vllm:request_success", "Count of successfully processed requests.", "finished_reason", FINISH_REASONS
        )
        self.time_to_first_token = series.histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.inter_token_latency = series.histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.request_time_per_output_token = series.histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.e2e_request_latency = series.histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )

    def _add_spec_decode_counters(self, series: _Series, num_speculative_tokens: int) -> None:
        """A speculative server's counters, with one `position` series per draft token."""
        self.spec_drafts = series.counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.spec_draft_tokens = series.counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.spec_accepted = series.counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        per_pos = series.counters_by(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            "position",
            [str(pos) for pos in range(num_speculative_tokens)],
        )
        self.spec_accepted_per_pos = list(per_pos.values())

    # Load ------------------------------------------------------------------

    def _exposed(self, key: str) -> float:
        pinned = self._pinned[key]
        return float(pinned if pinned is not None else getattr(self, key))

    def override_load(self, *, running: int | None = None, waiting: int | None = None) -> None:
        self._pinned = {"running": running, "waiting": waiting}

    def request_arrived(self) -> None:
        self.waiting += 1

    def request_started(self) -> None:
        self.waiting -= 1
        self.running += 1

    def request_left(self, started: bool) -> None:
        if started:
            self.running -= 1
        else:
            self.waiting -= 1

    # Observations ----------------------------------------------------------

    @property
    def speculative(self) -> bool:
        return self.num_speculative_tokens is not None

    def observe_spec_decode(
        self,
        num_drafts: int,
        num_draft_tokens: int,
        num_accepted_tokens: int,
        accepted_per_pos: Sequence[int] = (),
    ) -> None:
        """Add one engine step's speculative-decoding stats (vLLM's
        `SpecDecodingStats`). `accepted_per_pos[i]` counts drafts whose
        position-`i` token was accepted."""
        if self.spec_drafts is None:
            raise RuntimeError("this server was created without speculative decoding")
        if len(accepted_per_pos) > len(self.spec_accepted_per_pos):
            raise ValueError(
                f"{len(accepted_per_pos)} positions given, the server drafts "
                f"{len(self.spec_accepted_per_pos)} tokens"
            )
        with self._observing:
            self.spec_drafts.inc(num_drafts)
            self.spec_draft_tokens.inc(num_draft_tokens)
            self.spec_accepted.inc(num_accepted_tokens)
            for counter, accepted in zip(self.spec_accepted_per_pos, accepted_per_pos, strict=False):
                counter.inc(accepted)

    def observe_finished(
        self,
        *,
        prompt_tokens: int,
        generation_tokens: int,
        finish_reason: str,
        e2e_seconds: float,
        ttft_seconds: float | None,
        inter_token_seconds: Sequence[float] = (),
    ) -> None:
        """Record a request that ended (`finish_reason` "abort" when the client left)."""
        with self._observing:
            self.prompt_tokens.inc(prompt_tokens)
            self.generation_tokens.inc(generation_tokens)
            self.request_success[finish_reason if finish_reason in FINISH_REASONS else "stop"].inc()
            self.e2e_request_latency.observe(e2e_seconds)
            if ttft_seconds is not None:
                self.time_to_first_token.observe(ttft_seconds)
            for gap in inter_token_seconds:
                self.inter_token_latency.observe(gap)
            # vLLM's mean_time_per_output_token: the decode time over the tokens after the first, else 0
            decode_tokens = generation_tokens - 1
            self.request_time_per_output_token.observe(
                sum(inter_token_seconds) / decode_tokens if decode_tokens > 0 else 0.0)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition and its content type, negotiated from an `Accept`
        header as vLLM's `/metrics` does (OpenMetrics for Prometheus scrapes
        that ask for it, the classic text format otherwise).

        Like vLLM's, OpenMetrics samples then carry `vllm_` instead of `vllm:`
        (prometheus_client escapes the colon in sample names), so Prometheus
        stores `vllm_*` series unless its scrape config relabels them back."""
        encoder, content_type = choose_encoder(accept)
        with self._observing:
            return encoder(self.registry), content_type
