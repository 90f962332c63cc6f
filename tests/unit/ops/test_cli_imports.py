"""The command line builds its parser without the heavy libraries: `specgate
serve` (and each gateway worker) must not pay for torch, transformers or vLLM
that only the engine and the draft tools use."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "vllm", "numpy")


def test_the_parser_of_every_command_imports_no_heavy_library():
    code = ("import json, sys; from specgate.cli import build_parser; build_parser(); "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert json.loads(done.stdout) == []
