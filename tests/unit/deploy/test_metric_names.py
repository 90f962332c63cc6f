"""Every metric the dashboard and the rules query is one the stack exports."""

from __future__ import annotations

import pytest

from tests.unit.deploy.promql_names import CONTRACT_METRICS, metric_names


@pytest.mark.parametrize("expr, names", [
    ('sum by (pool, le) (rate(vllm:inter_token_latency_seconds_bucket{pool="a"}[5m]))',
     {"vllm:inter_token_latency_seconds_bucket"}),
    ("a / ignoring (position) group_left\nsum by (pool) (rate(b[$__rate_interval]))", {"a", "b"}),
    ("histogram_quantile(0.95, x) > ignoring (pool) group_left 1.2 * y{pool=\"standard\"}",
     {"x", "y"}),
    ("pool:vllm_x:p95_rate5m < 0.5 and on(pool) up offset 5m", {"pool:vllm_x:p95_rate5m", "up"}),
    ('label_replace(m, "dst", "$1", "src", "(.*)")', {"m"}),
    ("min(specgate_guard_up) == bool 1e3", {"specgate_guard_up"}),
])
def test_extractor_finds_exactly_the_selected_series(expr, names):
    assert metric_names(expr) == names


def test_contract_names_follow_exposition_naming():
    assert "vllm:spec_decode_num_accepted_tokens_total" in CONTRACT_METRICS
    assert "vllm:inter_token_latency_seconds_bucket" in CONTRACT_METRICS
    assert "specgate_requests_total" in CONTRACT_METRICS
    assert "specgate_request_duration_seconds_bucket" in CONTRACT_METRICS
    assert "specgate_guard_up" in CONTRACT_METRICS
    assert {"specgate_queue_waiting", "specgate_queue_waits_total", "specgate_queue_seconds_bucket"} \
        <= CONTRACT_METRICS
    # The V0 gauge is gone in vLLM V1 and must not be queried.
    assert "vllm:spec_decode_draft_acceptance_rate" not in CONTRACT_METRICS


def recording_rules(alert_rules) -> dict[str, str]:
    return {rule["record"]: rule["expr"] for group in alert_rules["groups"]
            for rule in group["rules"] if "record" in rule}


def test_recording_rules_read_only_exported_metrics(alert_rules):
    for record, expr in recording_rules(alert_rules).items():
        unknown = metric_names(expr) - CONTRACT_METRICS
        assert not unknown, f"{record} reads {unknown}"


def test_alerts_read_exported_or_recorded_metrics(alert_rules):
    known = CONTRACT_METRICS | recording_rules(alert_rules).keys()
    for group in alert_rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                unknown = metric_names(rule["expr"]) - known
                assert not unknown, f"{rule['alert']} reads {unknown}"


def dashboard_exprs(dashboard) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"]
            for target in panel.get("targets", [])]


def test_dashboard_reads_exported_or_recorded_metrics(dashboard, alert_rules):
    known = CONTRACT_METRICS | recording_rules(alert_rules).keys()
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 12
    for title, expr in exprs:
        names = metric_names(expr)
        assert names, f"panel {title!r} selects no metric: {expr}"
        assert names <= known, f"panel {title!r} reads {names - known}"
