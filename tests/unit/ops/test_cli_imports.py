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


def test_the_parser_imports_no_module_that_serve_may_load_compiled():
    """`specgate serve` loads the compiled decision after the parser is built: a module of it
    imported by then would be served from the sources beside compiled callers, so the build is
    refused (specgate/compiled.py)."""
    code = ("import json, sys; from specgate.cli import build_parser; build_parser(); "
            "from specgate.compiled import compiled_sources, source_root; "
            "names = {s[:-3].replace('/', '.') for s in compiled_sources(source_root())}; "
            "print(json.dumps(sorted(names & set(sys.modules))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert json.loads(done.stdout) == []
