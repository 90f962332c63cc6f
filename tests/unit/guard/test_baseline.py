"""The recorded baseline file: the fixed format, written and read back."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from gateway.control.baseline import Baseline, BaselineError, Percentiles, read_baseline, write_baseline


def test_round_trip_and_the_p95_the_guard_compares(tmp_path):
    baseline = Baseline(url="http://127.0.0.1:8001", model="m", recorded_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
                        requests=50, ttft_s=Percentiles(p50=0.05, p95=0.1), tpot_s=Percentiles(p50=0.01, p95=0.02),
                        e2e_s=Percentiles(p50=1.0, p95=2.0))
    path = tmp_path / "baseline.json"
    write_baseline(path, baseline)
    data = json.loads(path.read_text())
    assert set(data) == {"url", "model", "recorded_at", "requests", "ttft_s", "tpot_s", "e2e_s"}
    assert data["recorded_at"].startswith("2026-01-02T00:00:00") and data["tpot_s"] == {"p50": 0.01, "p95": 0.02}
    again = read_baseline(path)
    assert again == baseline
    assert (again.p95("itl"), again.p95("tpot"), again.p95("e2e")) == (0.02, 0.02, 2.0)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("content, message", [
    (None, "cannot read baseline"),
    ("{not json", "not a baseline file"),
    ('{"url": "u"}', "model: Field required"),
    *((json.dumps({"url": "u", "model": "m", "recorded_at": "2026-01-01T00:00:00Z", "requests": 1,
                   "ttft_s": {"p50": 0.1, "p95": 0.1}, "tpot_s": {"p50": 0.1, "p95": 0.2},
                   "e2e_s": {"p50": 1.0, "p95": 2.0}}).replace("0.2", number), "tpot_s.p95: Input should be a finite")
      for number in ("Infinity", "NaN", "1e999")),
])
def test_bad_files_say_why(tmp_path, content, message):
    path = tmp_path / "baseline.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BaselineError, match=message):
        read_baseline(path)
