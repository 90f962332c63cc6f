"""bench/decision.py, the decision's cost, runs against the code it times: both of its rows, the
shipped policy and the one whose pools state an objective, with every part timed, and the
whole decision per prompt for both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_decision_benchmark_runs_both_rows() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "decision.py"), "--calls", "40"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| 0-300") or line.startswith("| 200-300")]
    assert len(rows) == 4, run.stdout  # the parts and the whole, then the whole per prompt
    for row in rows[:2]:
        cells = [cell.strip() for cell in row.strip("|").split("|")][2:]
        assert len(cells) == 6 and all(float(cell) > 0 for cell in cells), row
    for row in rows[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")][2:]
        assert len(cells) == 3 and all(float(cell) > 0 for cell in cells), row
