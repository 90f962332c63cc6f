"""bench/request_path.py, the app's own CPU per request, runs against the code it times: every
mode and concurrency it is asked for, each request answered 200 by the app over loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "request_path.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def header_of(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, run.stderr
    return next(line for line in run.stdout.splitlines() if line.startswith("| mode |"))


def test_the_request_path_benchmark_measures_every_mode_and_concurrency() -> None:
    run = bench("--requests", "30", "--rounds", "2", "--modes", "json,stream", "--concurrency", "1,4")
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith(("| json |", "| stream |"))]
    assert [row.split("|")[1:3] for row in rows] == [[" json ", " 1 "], [" json ", " 4 "],
                                                      [" stream ", " 1 "], [" stream ", " 4 "]], run.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        rounds, median, failed = cells[2], cells[3], cells[4]
        assert len(rounds.split(",")) == 2 and all(float(v) > 0 for v in rounds.split(",")), row
        assert float(median) > 0 and failed == "0", row


def test_each_event_loop_asked_for_is_a_target_of_its_own() -> None:
    run = bench("--requests", "20", "--rounds", "1", "--modes", "json", "--concurrency", "2",
                "--loops", "asyncio,uvloop")
    header = header_of(run)
    assert "gateway (asyncio) median" in header and "gateway (uvloop) median" in header, run.stdout
    row = next(line for line in run.stdout.splitlines() if line.startswith("| json |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert all(float(v) > 0 for v in cells[2:6]) and cells[6] == "0", row


def test_an_unknown_event_loop_is_refused_by_name() -> None:
    run = bench("--loops", "trio", timeout=60)
    assert run.returncode == 2 and "unknown event loop(s) trio" in run.stderr, run.stderr


def test_a_loop_named_twice_is_one_target() -> None:
    header = header_of(bench("--requests", "10", "--rounds", "1", "--modes", "json", "--concurrency", "1",
                             "--loops", "asyncio,asyncio"))
    assert header.count("gateway") == 2 and "(asyncio)" not in header, header  # rounds and median of one target


@pytest.mark.slow  # under valgrind: tens of seconds
def test_instructions_are_counted_per_request_under_callgrind() -> None:
    run = bench("--instructions", "--requests", "20", "--rounds", "2", "--modes", "json", "--concurrency", "2")
    header = header_of(run)
    assert "gateway k instructions/req (rounds)" in header, run.stdout
    row = next(line for line in run.stdout.splitlines() if line.startswith("| json |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    counts = [float(v) for v in cells[2].split(",")]
    # a request through the app is hundreds of thousands of instructions; the counts of two rounds of
    # the same code are close (a timed round on a busy host is not)
    assert len(counts) == 2 and all(c > 100 for c in counts), row
    assert max(counts) / min(counts) < 1.5 and cells[4] == "0", row


def test_instructions_and_a_profile_are_not_asked_together() -> None:
    run = bench("--instructions", "--profile", timeout=60)
    assert run.returncode == 1 and "ask for one of them" in run.stderr, run.stderr


def test_another_event_is_counted_per_request_with_the_caches_simulated() -> None:
    run = bench("--instructions", "--event", "I1mr", "--requests", "20", "--rounds", "1", "--modes", "json",
                "--concurrency", "2")
    assert "gateway I1mr/req (rounds)" in header_of(run), run.stdout
    row = next(line for line in run.stdout.splitlines() if line.startswith("| json |"))
    misses = float(row.strip("|").split("|")[2])
    assert misses > 100, row  # a request through the app misses the L1 instruction cache thousands of times


def test_an_event_is_counted_only_under_callgrind() -> None:
    run = bench("--event", "Bcm", timeout=60)
    assert run.returncode == 1 and "ask for --instructions as well" in run.stderr, run.stderr
