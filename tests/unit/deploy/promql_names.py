"""Metric names a PromQL expression selects, and the names the stack exports.

The extractor is small on purpose: it removes what is not a series selector
(string literals, label matchers, ranges, grouping clauses, template
variables, numbers) and keeps the identifiers that are not functions or
keywords. Its own tests pin the cases the rules and the dashboard use.
"""

from __future__ import annotations

import re

# The metric contract (shared/DESIGN.md) and the wait queue's metrics
# (gateway/upstream/queue_metrics.py) and admission's and acceptance's, as exposed on /metrics: counters end in
# _total, histograms are queried through _bucket/_sum/_count.
GATEWAY_COUNTERS = ("requests", "upstream_errors", "retries", "flag_flips", "policy_reloads", "queue_waits",
                    "route_decisions", "admission_holds")
GATEWAY_HISTOGRAMS = ("request_duration_seconds", "time_to_first_byte_seconds", "overhead_seconds",
                      "queue_seconds", "predicted_e2e_seconds", "admission_wait_seconds")
GATEWAY_GAUGES = ("in_flight", "endpoint_healthy", "speculative_enabled", "guard_up", "queue_waiting",
                  "state_up", "state_configured", "admission_held", "acceptance_rate")
VLLM_COUNTERS = (
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos",
)
VLLM_GAUGES = ("num_requests_running", "num_requests_waiting")
VLLM_HISTOGRAMS = (
    "e2e_request_latency_seconds",
    "inter_token_latency_seconds",
    "request_time_per_output_token_seconds",
    "time_to_first_token_seconds",
)
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _exported(prefix: str, counters, gauges, histograms) -> set[str]:
    names = {f"{prefix}{c}_total" for c in counters} | {f"{prefix}{g}" for g in gauges}
    names |= {f"{prefix}{h}{s}" for h in histograms for s in HISTOGRAM_SUFFIXES}
    return names


CONTRACT_METRICS = frozenset(
    _exported("specgate_", GATEWAY_COUNTERS, GATEWAY_GAUGES, GATEWAY_HISTOGRAMS)
    | _exported("vllm:", VLLM_COUNTERS, VLLM_GAUGES, VLLM_HISTOGRAMS)
)

_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
})
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_NUMBER = re.compile(r"(?<![\w:])\d[\w.]*")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression reads (functions and keywords excluded)."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group()
        is_call = text[match.end():].lstrip().startswith("(")
        if not is_call and name.lower() not in _KEYWORDS:
            names.add(name)
    return names
