"""A backend shaped like vLLM's API server, for `specgate up --backend-command`.

    python -m tests.integration.up.backend --port PORT [fake vLLM options]

It forks a helper first, as vLLM's API server forks its engine core, and the
helper ignores SIGTERM, so only SIGKILL to the process group ends it; then it
runs the fake vLLM (tests/fakes/vllm_command.py) on PORT.
"""

from __future__ import annotations

import os
import signal
import sys

from tests.fakes.vllm_command import main as fake_vllm


def engine_core() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        signal.pause()


def main(argv: list[str]) -> int:
    if os.fork() == 0:
        engine_core()
    return fake_vllm(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
