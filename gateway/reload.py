"""Policy hot reload: on file change, on SIGHUP, and on request.

A new file that fails validation is rejected whole: the policy in force keeps
serving, and the reason is logged and counted.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import structlog

from gateway.metrics import GatewayMetrics
from gateway.policy import Policy, PolicyError, load_policy


class PolicyReloader:
    def __init__(self, path: Path, apply: Callable[[Policy], None], metrics: GatewayMetrics) -> None:
        self.path = path
        self.apply = apply
        self.metrics = metrics
        self.log = structlog.get_logger("specgate.policy")
        self._digest = self._read_digest()
        self.last_error: str | None = None

    def reload(self) -> Policy:
        """Load and apply the file; raises PolicyError (and keeps the old policy) when invalid."""
        self._digest = self._read_digest()
        try:
            policy = load_policy(self.path)
        except PolicyError as exc:
            self.last_error = str(exc)
            self.metrics.policy_reloads.labels("rejected").inc()
            self.log.warning("policy_rejected", path=str(self.path), errors=exc.problems and
                             [f"line {line}: {msg}" for line, msg in exc.problems])
            raise
        self.apply(policy)
        self.last_error = None
        self.metrics.policy_reloads.labels("applied").inc()
        self.log.info("policy_applied", path=str(self.path), rules=len(policy.rules),
                      pools=list(policy.pools))
        return policy

    def reload_quietly(self) -> None:
        try:
            self.reload()
        except PolicyError:
            pass

    async def watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            digest = await asyncio.to_thread(self._read_digest)
            if digest != self._digest:
                self.reload_quietly()

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None
