"""bench/decision.py, the decision's cost, runs against the code it times: both of its rows, the
shipped policy and the one whose pools state an objective, with every part timed, and the
whole decision per prompt for both, then per round beside the host's reference loop."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_decision_benchmark_runs_both_rows() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "decision.py"), "--calls", "40", "--rounds", "3"],
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
    rounds = [line for line in run.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row.split("|")[1].strip() for row in rounds] == ["1", "2", "3"], run.stdout
    for row in rounds:  # the loop before and after, then each row's mix and its three prompts
        cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
        loop = [float(value) for value in cells[0].split(",")]
        assert len(loop) == 2 and all(value > 0 for value in loop), row
        assert len(cells) == 9 and all(float(cell) > 0 for cell in cells[1:]), row
