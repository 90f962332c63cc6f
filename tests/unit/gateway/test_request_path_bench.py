"""bench/request_path.py, the app's own CPU per request, runs against the code it times: every
mode and concurrency it is asked for, each request answered 200 by the app over loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_request_path_benchmark_measures_every_mode_and_concurrency() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "request_path.py"), "--requests", "30",
                          "--rounds", "2", "--modes", "json,stream", "--concurrency", "1,4"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith(("| json |", "| stream |"))]
    assert [row.split("|")[1:3] for row in rows] == [[" json ", " 1 "], [" json ", " 4 "],
                                                      [" stream ", " 1 "], [" stream ", " 4 "]], run.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        rounds, median, failed = cells[2], cells[3], cells[4]
        assert len(rounds.split(",")) == 2 and all(float(v) > 0 for v in rounds.split(",")), row
        assert float(median) > 0 and failed == "0", row
