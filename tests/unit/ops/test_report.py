"""`specgate report` against a real Prometheus whose storage holds three days of
synthetic series with known rates (blocks built by `promtool tsdb create-blocks-from`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gateway.control.baseline import Baseline, Percentiles, write_baseline
from specgate.ops.weekly import parse_duration, recommendations
from tests.fakes.process import free_port, wait_until_ok
from tests.unit.deploy.conftest import require_tool

ROOT = Path(__file__).resolve().parents[3]
END = 1_700_006_400  # on the hour
DAYS = 3
MINUTES = DAYS * 1440
START = END - MINUTES * 60
ACCEPTED_PER_MINUTE = (80, 50, 65)  # per day; 100 draft tokens a minute throughout
# the same drafts split by traffic class: class -> (draft tokens a minute, accepted a minute per day)
CLASSES = {"chat/low": (40, (30, 15, 15)), "summarization/greedy": (30, (27, 20, 21)),
           "code/greedy": (30, (23, 15, 29))}
OFF_AT = (300, 900, 1700, 2300, 3100, 3900)  # minutes where the guard turns speculation off for 30 minutes
SPEC_BUCKETS = {"0.5": 20, "1": 80, "2.5": 100, "+Inf": 100}  # per minute, cumulative
STD_BUCKETS = {"0.5": 0, "1": 0, "2.5": 10, "+Inf": 10}


def openmetrics() -> str:
    """Counters whose increment between minute i-1 and i is set by the day minute i-1 falls in."""
    times = [START + 60 * i for i in range(MINUTES + 1)]

    def counter(per_minute) -> list[float]:
        values, total = [], 0.0
        for i in range(MINUTES + 1):
            values.append(total)
            total += per_minute(i)
        return values

    def off(i: int) -> bool:
        return any(m <= i < m + 30 for m in OFF_AT)

    families: list[tuple[str, str, list[tuple[str, str, list[float]]]]] = [
        ("vllm:spec_decode_num_draft_tokens", "counter",
         [("vllm:spec_decode_num_draft_tokens_total", f'instance="10.0.0.{n}:8000",traffic_class="{name}"',
           counter(lambda i, drafts=drafts: drafts)) for n, (name, (drafts, _)) in enumerate(CLASSES.items())]),
        ("vllm:spec_decode_num_accepted_tokens", "counter",
         [("vllm:spec_decode_num_accepted_tokens_total", f'instance="10.0.0.{n}:8000",traffic_class="{name}"',
           counter(lambda i, daily=daily: daily[min(i // 1440, DAYS - 1)]))
          for n, (name, (_, daily)) in enumerate(CLASSES.items())]),
        ("specgate_requests", "counter",
         [("specgate_requests_total", 'pool="speculative",rule="default",code="200"', counter(lambda i: 30)),
          ("specgate_requests_total", 'pool="standard",rule="busy",code="200"', counter(lambda i: 10))]),
        ("specgate_flag_flips", "counter",
         [("specgate_flag_flips_total", 'pool="speculative",reason="low_acceptance"',
           counter(lambda i: 1 if i + 1 in OFF_AT else 0)),
          ("specgate_flag_flips_total", 'pool="speculative",reason="recovered"',
           counter(lambda i: 1 if i + 1 - 30 in OFF_AT else 0))]),
        ("specgate_speculative_enabled", "gauge",
         [("specgate_speculative_enabled", 'pool="speculative"',
           [0.0 if off(i) else 1.0 for i in range(MINUTES + 1)])]),
        ("specgate_request_duration_seconds", "histogram",
         [("specgate_request_duration_seconds_bucket", f'pool="{pool}",le="{le}"', counter(lambda i, n=n: n))
          for pool, buckets in (("speculative", SPEC_BUCKETS), ("standard", STD_BUCKETS))
          for le, n in buckets.items()]),
    ]
    lines = []
    for family, kind, members in families:
        lines.append(f"# TYPE {family} {kind}")
        for name, labels, values in members:
            lines += [f"{name}{{{labels}}} {value:g} {t}" for t, value in zip(times, values, strict=True)]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[str]:
    promtool, binary = require_tool("promtool"), require_tool("prometheus")
    work = tmp_path_factory.mktemp("prometheus")
    (work / "series.om").write_text(openmetrics())
    created = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=72h",
                              str(work / "series.om"), str(work / "data")], capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    (work / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    port = free_port()
    process = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                                f"--storage.tsdb.path={work / 'data'}", "--storage.tsdb.retention.time=100y",
                                f"--web.listen-address=127.0.0.1:{port}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_ok(f"http://127.0.0.1:{port}/-/ready", process, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait(timeout=10)


def expected_quantile(q: float, buckets: dict[str, float]) -> float:
    """Prometheus's linear interpolation inside the bucket holding rank q * total."""
    bounds = sorted((float(le), n) for le, n in buckets.items())
    rank, below, lower = q * bounds[-1][1], 0.0, 0.0
    for upper, cumulative in bounds:
        if cumulative >= rank:
            return lower + (upper - lower) * (rank - below) / (cumulative - below)
        lower, below = upper, cumulative
    raise AssertionError


@pytest.mark.slow
def test_report_numbers_equal_the_known_rates(prometheus, tmp_path):
    baseline = tmp_path / "baseline.json"
    write_baseline(baseline, Baseline(url="http://std", model="m",
                                      recorded_at=datetime(2023, 11, 1, tzinfo=timezone.utc),
                                      requests=100, ttft_s=Percentiles(p50=0.1, p95=0.2),
                                      tpot_s=Percentiles(p50=0.02, p95=0.03), e2e_s=Percentiles(p50=1.5, p95=3.0)))
    out = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "specgate.cli", "report", "--prometheus", prometheus,
                             "--since", f"{DAYS}d", "--until", str(END), "--step", "1h", "--baseline", str(baseline),
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "report.json").read_text())

    rate = report["acceptance"]
    assert rate["points"] == DAYS * 24  # one point an hour, each window inside one day
    assert rate["min"] == pytest.approx(0.5, abs=1e-9) and rate["max"] == pytest.approx(0.8, abs=1e-9)
    assert rate["avg"] == pytest.approx(0.65, abs=1e-9) and rate["overall"] == pytest.approx(0.65, abs=1e-9)

    combined = {le: SPEC_BUCKETS[le] + STD_BUCKETS[le] for le in SPEC_BUCKETS}
    latency = report["latency"]
    assert latency["e2e_p50_s"] == pytest.approx(expected_quantile(0.5, combined))
    assert latency["e2e_p50_s_by_pool"] == pytest.approx({"speculative": 0.75, "standard": 1.75})
    assert latency["speedup"] == pytest.approx(1.5 / expected_quantile(0.5, combined))

    assert report["fallbacks"]["count"] == len(OFF_AT)
    assert report["fallbacks"]["flips_by_reason"] == {"low_acceptance": 6, "recovered": 6}
    assert report["fallbacks"]["seconds_off_by_pool"] == {"speculative": pytest.approx(len(OFF_AT) * 30 * 60)}
    assert report["traffic"]["share_by_pool"] == pytest.approx({"speculative": 0.75, "standard": 0.25})

    assert len(report["recommendations"]) == 1 and "6 automatic fallbacks" in report["recommendations"][0]
    markdown = (out / "report.md").read_text()
    assert "| 0.650 | 0.500 | 0.800 | 0.650 |" in markdown and "speedup: 1.89x" in markdown

    # over the three days only chat is under 0.55 (60 of 120 drafts a minute-day accepted)
    retrain = report["retrain"]
    assert retrain["by_class"]["chat/low"] == {"acceptance": pytest.approx(0.5),
                                               "draft_tokens": pytest.approx(40 * MINUTES)}
    assert retrain["by_class"]["code/greedy"]["acceptance"] == pytest.approx(67 / 90)
    assert [item["class"] for item in retrain["fallen"]] == ["chat/low"]
    assert "specgate draft capture --dir captured --out prompts.jsonl --class chat/low" in retrain["commands"][0]
    assert "| chat/low | 0.500 |" in markdown and "- chat/low: acceptance 0.500, under 0.55" in markdown


def report_json(prometheus: str, out: Path, *extra: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "specgate.cli", "report", "--prometheus", prometheus,
                             "--step", "1h", "--out", str(out), *extra],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_report_names_the_classes_whose_acceptance_fell_since_the_previous_report(prometheus, tmp_path):
    first = report_json(prometheus, tmp_path / "day1", "--since", "1d", "--until", str(START + 1440 * 60))
    assert first["retrain"]["fallen"] == [] and "commands" not in first["retrain"]
    assert first["retrain"]["by_class"]["summarization/greedy"]["acceptance"] == pytest.approx(0.9)
    last = report_json(prometheus, tmp_path / "day3", "--since", "1d", "--until", str(END),
                       "--previous", str(tmp_path / "day1" / "report.json"))
    fallen = {item["class"]: item for item in last["retrain"]["fallen"]}
    # chat: 0.75 -> 0.375, under 0.55 and fallen; summarization: 0.9 -> 0.7, fallen by 0.2; code rose
    assert sorted(fallen) == ["chat/low", "summarization/greedy"]
    assert fallen["chat/low"]["why"] == "under 0.55; fell from 0.750 (more than 0.10)"
    assert fallen["summarization/greedy"]["acceptance"] == pytest.approx(0.7)
    assert fallen["summarization/greedy"]["why"] == "fell from 0.900 (more than 0.10)"
    assert last["retrain"]["commands"][0].endswith("--class chat/low --class summarization/greedy")
    assert "capture:\n  enabled: true\n  share: 0.02" in last["retrain"]["policy"]
    markdown = (tmp_path / "day3" / "report.md").read_text()
    assert "## Retrain the draft for these classes" in markdown and "specgate draft train" in markdown
    # a higher bar for a fall leaves only the class under 0.55
    strict = report_json(prometheus, tmp_path / "strict", "--since", "1d", "--until", str(END),
                         "--previous", str(tmp_path / "day1" / "report.json"), "--acceptance-drop", "0.3")
    assert [item["class"] for item in strict["retrain"]["fallen"]] == ["chat/low"]


@pytest.mark.slow
def test_report_errors_are_clear(prometheus, tmp_path):
    bad = subprocess.run([sys.executable, "-m", "specgate.cli", "report", "--prometheus", prometheus, "--since", "7x"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not a duration: '7x'" in bad.stderr
    down = subprocess.run([sys.executable, "-m", "specgate.cli", "report", "--prometheus",
                           f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "unreachable" in down.stderr
    (tmp_path / "old.json").write_text("{not json")
    unreadable = subprocess.run([sys.executable, "-m", "specgate.cli", "report", "--prometheus", prometheus,
                                 "--previous", str(tmp_path / "old.json"), "--out", str(tmp_path)],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert unreadable.returncode == 2 and "cannot read the previous report" in unreadable.stderr


def test_recommendations_follow_the_thresholds():
    week = {"seconds": 7 * 86400}
    quiet = {"period": week, "acceptance": {"avg": 0.7}, "latency": {"speedup": 2.0}, "fallbacks": {"count": 5}}
    assert recommendations(quiet) == []
    poor = {"period": week, "acceptance": {"avg": 0.5}, "latency": {"speedup": 1.2}, "fallbacks": {"count": 6}}
    advice = recommendations(poor)
    assert len(advice) == 3 and "retrain" in advice[0] and "1.20x" in advice[1] and "6 automatic" in advice[2]
    assert parse_duration("7d") == 604800 and parse_duration("90s") == 90
