"""Every command answers broken arguments with one line on stderr and a nonzero
exit: never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the command line in a process of its own, per case

ROOT = Path(__file__).resolve().parents[3]

# {tmp}: a fresh folder holding request.json and bad.yaml; {dead}: a URL nothing answers on
BROKEN_CALLS = {
    "explain-missing-request": "explain --policy {policy} {tmp}/missing.json",
    "explain-missing-policy": "explain --policy {tmp}/missing.yaml {tmp}/request.json",
    "explain-request-not-json": "explain --policy {policy} {tmp}/bad.yaml",
    "check-bad-yaml": "check {tmp}/bad.yaml",
    "serve-missing-policy": "serve --policy {tmp}/missing.yaml",
    "bench-closed-port": "bench --url {dead}",
    "baseline-closed-port": "baseline record --url {dead} --out {tmp}/baseline.json",
    "report-closed-port": "report --prometheus {dead}",
    "check-draft-missing-paths": "check-draft {tmp}/no-target {tmp}/no-draft",
    "sim-bad-kind": "sim --kind bogus --port 1",
    "up-bad-engine": "up --engine bogus",
    "engine-bad-drafter": "engine --drafter bogus",
}


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", sorted(BROKEN_CALLS))
def test_broken_arguments_get_one_clear_line(tmp_path, case):
    (tmp_path / "request.json").write_text('{"messages": [{"role": "user", "content": "hi"}]}')
    (tmp_path / "bad.yaml").write_text("version: 1\npools: [unclosed\n")
    argv = BROKEN_CALLS[case].format(tmp=tmp_path, dead=f"http://127.0.0.1:{closed_port()}",
                                     policy=ROOT / "policies" / "default.yaml").split()
    done = subprocess.run([sys.executable, "-m", "specgate.cli", *argv], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    # ours ("specgate CMD: ..."), argparse's ("specgate CMD: error: ...") or a policy's "PATH:LINE: ..."
    assert last.startswith((f"specgate {argv[0]}: ", str(tmp_path))), done.stderr
