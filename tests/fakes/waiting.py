"""Waiting for a state in a test: poll until it holds, with a timeout that only guards against a hang."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 30.0, poll_s: float = 0.05) -> None:
    """Poll `predicate()` until it is true; fail the test, naming `what`, after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for: {what}")
        time.sleep(poll_s)
