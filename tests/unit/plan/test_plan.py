"""`specgate plan`: workloads whose best fleet is obvious get that recommendation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgate.cli import main
from specgate.plan.workload import WorkloadError, load

GREEDY_CODE = """
phases: [{duration_s: 60, rate: 2}]
classes: [{domain: code, temperature: 0, max_tokens: 256}]
"""
HOT_CHAT = """
phases: [{duration_s: 40, rate: 12}]
classes: [{domain: chat, temperature: 1.5, max_tokens: 256}]
slo: {ttft_s: 1.0, tpot_s: 0.05}
"""


def plan(tmp_path: Path, capsys, workload: str, *flags: str, name: str = "w.yaml") -> dict:
    path = tmp_path / name
    path.write_text(workload)
    assert main(["plan", str(path), "--gpus", "2", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def by_label(result: dict) -> dict[str, dict]:
    return {row["option"]: row for row in result["options"]}


def test_greedy_code_under_light_load_recommends_speculation(tmp_path, capsys):
    result = plan(tmp_path, capsys, GREEDY_CODE, "--kinds", "speculative,standard")
    assert result["recommended"]["option"] == "2 speculative"
    rows = by_label(result)
    assert set(rows) == {"2 speculative", "1 speculative + 1 standard", "2 standard"}
    assert rows["2 speculative"]["mean_e2e_s"] < 0.6 * rows["2 standard"]["mean_e2e_s"]


def test_hot_chat_under_heavy_load_recommends_standard(tmp_path, capsys):
    result = plan(tmp_path, capsys, HOT_CHAT, "--kinds", "speculative,standard")
    assert result["recommended"]["option"] == "2 standard"
    rows = by_label(result)
    assert rows["2 standard"]["goodput_rps"] > 1.5 * rows["2 speculative"]["goodput_rps"]


def test_with_dynamic_candidates_hot_chat_keeps_speculation_off_the_fleet(tmp_path, capsys):
    result = plan(tmp_path, capsys, HOT_CHAT)
    assert result["recommended"]["speculative"] == 0
    dynamic = [row for row in result["options"] if row["dynamic"]]
    # 1 + 1 speculative and 1 + 1 standard with each of five schedules; 2 dynamic on one of them,
    # or staggered over any two of them
    assert len(dynamic) == 5 + 5 + 5 + 10
    assert all(len(row["schedules"]) == row["dynamic"] for row in dynamic)
    assert all(schedule[0][0] == 1 for row in dynamic for schedule in row["schedules"])  # vLLM's format


def test_a_staggered_pair_is_weighed_with_each_replica_on_its_own_schedule(tmp_path, capsys):
    result = plan(tmp_path, capsys, HOT_CHAT, "--kinds", "dynamic")
    staggered = [row for row in result["options"] if len({json.dumps(s) for s in row["schedules"]}) == 2]
    assert len(staggered) == 10 and len(result["options"]) == 15
    row = by_label(result)["1 dynamic [1-8:3 9+:0] + 1 dynamic [1-16:3 17+:0]"]
    assert row["schedules"] == [[[1, 8, 3], [9, 9, 0]], [[1, 16, 3], [17, 17, 0]]]


def test_a_classs_measured_acceptance_overrides_the_simulators(tmp_path, capsys):
    bad_drafts = GREEDY_CODE.replace("max_tokens: 256}", "max_tokens: 256, acceptance: 0.02}")
    result = plan(tmp_path, capsys, bad_drafts, "--kinds", "speculative,standard")
    assert result["recommended"]["option"] == "2 standard"


def test_the_table_marks_the_recommendation_and_the_plot_is_a_png(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    path.write_text(GREEDY_CODE)
    assert main(["plan", str(path), "--gpus", "2", "--kinds", "speculative,standard", "--plot",
                 str(tmp_path / "plan.png")]) == 0
    out = capsys.readouterr().out
    assert "* 2 speculative" in out and out.rstrip().endswith("recommended: 2 speculative")
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_trace_and_a_capture_are_read_as_workloads(tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [{"at": 0.5, "stream": True, "messages": [{"role": "user", "content": "def f(): pass"}],
             "max_tokens": 64, "temperature": 0.0, "domain": "code"},
            {"at": 1.0, "control": {"domain_quality": {"code": 0.5}}},
            {"at": 2.0, "stream": False, "messages": [{"role": "user", "content": "hi"}], "max_tokens": None,
             "temperature": 1.2, "domain": "code"}]
    trace.write_text("\n".join(json.dumps(row) for row in rows))
    first, second = load(trace).requests
    assert (first.domain, first.max_tokens, first.quality) == ("code", 64, 1.0)
    assert (second.temperature, second.quality) == (1.2, 0.5)
    capture = tmp_path / "c.jsonl"
    capture.write_text("\n".join(json.dumps({"time": f"2026-01-01T00:00:0{s}Z", "class": cls, "endpoint": "chat",
                                             "messages": [{"role": "user", "content": "x"}]})
                                 for s, cls in ((0, "code/greedy"), (0, "chat/hot"), (3, "math/low"))))
    requests = load(capture).requests
    assert [(r.at, r.domain, r.temperature) for r in requests] == [
        (0.0, "code", 0.0), (0.5, "chat", 1.3), (3.0, "math", 0.3)]


@pytest.mark.parametrize("text,message", [
    ("phases: [{duration_s: 10, rate: 1}]\nclasses: [{domain: poetry}]", "domain must be one of"),
    ("phases: []\nclasses: [{domain: code}]", "phases: a non-empty list"),
    ("phases: [{duration_s: 10, rate: -1}]\nclasses: [{domain: code}]", "rate: a number >= 0"),
    ("phases: [{duration_s: 10, rate: 1}]\nclasses: [{domain: code, acceptance: 1.5}]", "below 1"),
    ("[unclosed", "not YAML"),
    ("phases: [{duration_s: .inf, rate: 1}]\nclasses: [{domain: code}]", "duration_s: a number"),
    ("phases: [{duration_s: 10, rate: .nan}]\nclasses: [{domain: code}]", "rate: a number"),
    # a thousand years at a thousand a second: refused at the cap, not generated until memory runs out
    ("phases: [{duration_s: 31536000000, rate: 1000}]\nclasses: [{domain: code}]", "more than 100000 requests"),
])
def test_a_bad_workload_is_one_clear_line(tmp_path, capsys, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message):
        load(path)
    assert main(["plan", str(path), "--gpus", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("specgate plan: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("row,message", [
    ({"at": float("inf"), "max_tokens": 10}, "at: a number >= 0"),
    ({"at": -5}, "at: a number >= 0"),
    ({"at": 0, "temperature": float("nan")}, "temperature: a number >= 0 and <= 2"),
    ({"at": 0, "messages": "hi"}, "messages: a list of"),
    ({"at": 0, "max_tokens": 0.5}, "max_tokens: a number >= 1"),
    ({"at": 0, "control": {"domain_quality": {"code": "x"}}}, "domain_quality.code: a number"),
])
def test_a_bad_trace_row_is_named_by_its_line_and_field(tmp_path, capsys, row, message):
    path = tmp_path / "bad.jsonl"
    good = {"at": 0.5, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(WorkloadError, match=message):
        load(path)
    assert main(["plan", str(path), "--gpus", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"specgate plan: {path}:2: ") and message in err and "Traceback" not in err


def test_bad_flags_are_refused_before_any_work(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    path.write_text(GREEDY_CODE)
    assert main(["plan", str(path), "--gpus", "2", "--kinds", "fast"]) == 1
    assert "--kinds takes" in capsys.readouterr().err
    assert main(["plan", str(path), "--gpus", "2", "--calibration", "70b-4xa100-draft1b"]) == 1
    assert "takes 4 GPUs" in capsys.readouterr().err
    assert main(["plan", str(path), "--gpus", "1000000"]) == 1  # refused, not a trillion options
    assert "the plan weighs at most 64" in capsys.readouterr().err
