"""Test doubles that talk real HTTP on 127.0.0.1.

`FakeVllm` (tests.fakes.vllm) is a controllable fake vLLM server;
`FakeVllmProcess` (tests.fakes.process) runs one as a child process. Names are
resolved on first use so that `python -m tests.fakes.vllm_command` runs cleanly.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Disconnect": "tests.fakes.vllm",
    "FakeVllm": "tests.fakes.vllm",
    "Script": "tests.fakes.vllm",
    "FakeVllmProcess": "tests.fakes.process",
    "RecordedRequest": "tests.fakes.faults",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tests.fakes' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
