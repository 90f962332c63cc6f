"""Policy hot reload: on file change, on SIGHUP, and on request.

A new file that fails validation is rejected whole: the policy in force keeps
serving, and the reason is logged and counted (`policy_reloads_total{result}`:
`applied`, `rejected` for a file that breaks the policy's rules, `error` for
one the loader could not even take apart, say YAML nested deeper than the
parser's recursion limit). The watcher survives all of them and keeps watching.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import structlog

from gateway.decide.policy import Policy, PolicyError, load_policy
from gateway.metrics import GatewayMetrics


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
            self.log.warning("policy_rejected", path=str(self.path),
                             errors=[f"line {line}: {msg}" for line, msg in exc.problems])
            raise
        except Exception as exc:  # noqa: BLE001 (any failure to load is a rejected file, never a dead watcher)
            error = PolicyError(str(self.path), [(1, f"cannot load policy: {type(exc).__name__}: {exc}")])
            self.last_error = str(error)
            self.metrics.policy_reloads.labels("error").inc()
            self.log.error("policy_load_failed", path=str(self.path), error=f"{type(exc).__name__}: {exc}",
                           action="the policy in force keeps serving")
            raise error from None
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
            try:
                digest = await asyncio.to_thread(self._read_digest)
                if digest != self._digest:
                    self.reload_quietly()
            except Exception as exc:  # noqa: BLE001 (applying a policy may fail too: keep watching)
                self.metrics.policy_reloads.labels("error").inc()
                self.log.error("policy_watch_failed", path=str(self.path), error=f"{type(exc).__name__}: {exc}")

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None
