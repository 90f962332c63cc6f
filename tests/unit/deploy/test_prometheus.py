"""Prometheus config and rules, checked and unit-tested by promtool."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.unit.deploy.conftest import DEPLOY, require_tool

PROMETHEUS = DEPLOY / "prometheus"


def promtool(*args: str, cwd=PROMETHEUS) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_config_is_valid():
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


@pytest.mark.slow
def test_rules_are_valid():
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_alert_unit_tests_pass():
    """alerts_test.yml drives LowAcceptRate, CriticalAcceptRate, the latency
    regression, fallback and guard alerts with known input series."""
    result = promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.slow
def test_alert_unit_tests_catch_a_wrong_threshold(tmp_path):
    """The promtool tests fail when a threshold moves: they pin the PromQL."""
    rules = (PROMETHEUS / "alerts.yml").read_text()
    moved = rules.replace("ratio_rate5m < 0.5", "ratio_rate5m < 0.35")
    assert moved != rules
    (tmp_path / "alerts.yml").write_text(moved)
    (tmp_path / "alerts_test.yml").write_text((PROMETHEUS / "alerts_test.yml").read_text())
    result = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "LowAcceptRate" in result.stdout + result.stderr


def test_required_alerts_exist_with_their_windows(alert_rules):
    alerts = {}
    for group in alert_rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                alerts.setdefault(rule["alert"], []).append(rule)
    expected = {
        "LowAcceptRate": ("10m", "warning"),
        "CriticalAcceptRate": ("5m", "critical"),
        "SpeculativeLatencyRegression": ("10m", "warning"),
        "GatewayFallbackActive": ("5m", "warning"),
        "GuardDown": ("2m", "warning"),
        "StateStoreDown": ("2m", "warning"),
    }
    assert set(alerts) == set(expected)
    for name, (window, severity) in expected.items():
        for rule in alerts[name]:
            assert (rule["for"], rule["labels"]["severity"]) == (window, severity)
    latency = {r["labels"]["latency"] for r in alerts["SpeculativeLatencyRegression"]}
    assert latency == {"time_per_output_token", "e2e"}


def test_every_backend_job_labels_its_pool():
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    pools = {}
    for job in config["scrape_configs"]:
        labels = [r for r in job.get("relabel_configs", []) if r.get("target_label") == "pool"]
        if job["job_name"].startswith("vllm-"):
            assert len(labels) == 1, job["job_name"]
            pools[job["job_name"]] = labels[0]["replacement"]
    assert pools == {"vllm-speculative": "speculative", "vllm-standard": "standard"}
    assert config["rule_files"] == ["alerts.yml"]
