"""Policy hot reload: on file change, on SIGHUP, and on request.

The file is read and parsed in a worker thread, never on the event loop, and
bounded: its size, its nesting depth and YAML anchors and aliases are
refused by the loader (`gateway/policy/yaml_lines.py`), and the whole load
by a time budget, so no file can stall serving. A new file that fails is
rejected whole: the policy in force keeps serving, and the reason is logged
and counted (`policy_reloads_total{result}`: `applied`, `rejected` for a
file that breaks the policy's rules or the loader's bounds, `error` for one
the loader could not take apart otherwise, `timeout` for one whose load ran
past the budget). Reloads run one at a time. The watcher survives all of
them and keeps watching.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import structlog

from gateway.metrics import GatewayMetrics
from gateway.policy.compiled import Policy
from gateway.policy.loader import PolicyError, parse_policy
from gateway.policy.yaml_lines import decode, read_bytes

LOAD_BUDGET_S = 10.0  # the longest a load may take before it is given up


class PolicyReloader:
    def __init__(self, path: Path, apply: Callable[[Policy], None], metrics: GatewayMetrics,
                 budget_s: float = LOAD_BUDGET_S) -> None:
        self.path = path
        self.apply = apply
        self.metrics = metrics
        self.budget_s = budget_s
        self.log = structlog.get_logger("specgate.policy")
        self._digest = self._read_digest()
        self._lock = asyncio.Lock()
        self._signalled: set[asyncio.Task[None]] = set()
        self.last_error: str | None = None

    async def reload(self) -> Policy:
        """Load (in a thread) and apply the file; raises PolicyError (and keeps the old policy) when it fails."""
        async with self._lock:
            policy = await self._load()
            self.apply(policy)
            self.last_error = None
            self.metrics.policy_reloads.labels("applied").inc()
            self.log.info("policy_applied", path=str(self.path), rules=len(policy.rules), pools=list(policy.pools))
            return policy

    async def _load(self) -> Policy:
        try:
            data = await asyncio.to_thread(self._read_bytes)
            self._digest = None if data is None else hashlib.sha256(data).digest()
            return await asyncio.wait_for(asyncio.to_thread(self._parse, data), self.budget_s)
        except PolicyError as exc:
            self._failed("rejected", exc)
            self.log.warning("policy_rejected", path=str(self.path),
                             errors=[f"line {line}: {msg}" for line, msg in exc.problems])
            raise
        except TimeoutError:
            result, problem = "timeout", f"loading the policy took over {self.budget_s:g} s"
        except Exception as exc:  # noqa: BLE001 (any failure to load is a rejected file, never a dead watcher)
            result, problem = "error", f"cannot load policy: {type(exc).__name__}: {exc}"
        error = PolicyError(str(self.path), [(1, problem)])
        self._failed(result, error)
        self.log.error("policy_load_failed", path=str(self.path), error=str(error), result=result,
                       action="the policy in force keeps serving")
        raise error from None

    def _failed(self, result: str, error: PolicyError) -> None:
        self.last_error = str(error)
        self.metrics.policy_reloads.labels(result).inc()

    async def reload_quietly(self) -> None:
        try:
            await self.reload()
        except PolicyError:
            pass

    def reload_soon(self) -> None:
        """For a signal handler: reload in a task of its own."""
        task = asyncio.get_running_loop().create_task(self.reload_quietly())
        self._signalled.add(task)
        task.add_done_callback(self._signalled.discard)

    async def watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                digest = await asyncio.to_thread(self._read_digest)
                if digest != self._digest:
                    await self.reload_quietly()
            except Exception as exc:  # noqa: BLE001 (applying a policy may fail too: keep watching)
                self.metrics.policy_reloads.labels("error").inc()
                self.log.error("policy_watch_failed", path=str(self.path), error=f"{type(exc).__name__}: {exc}")

    def _parse(self, data: bytes | None) -> Policy:
        if data is None:
            raise PolicyError(str(self.path), [(1, "cannot read policy: the file cannot be opened")])
        try:
            text = decode(data)
        except ValueError as exc:  # YamlError (over the byte limit) and UnicodeDecodeError
            raise PolicyError(str(self.path), [(1, f"cannot read policy: {exc}")]) from None
        return parse_policy(text, str(self.path))

    def _read_bytes(self) -> bytes | None:
        """One bounded read (a huge file is read no further than one past the limit):
        the digest the watcher compares and the policy applied come from the same bytes."""
        try:
            return read_bytes(str(self.path))
        except OSError:
            return None

    def _read_digest(self) -> bytes | None:
        data = self._read_bytes()
        return None if data is None else hashlib.sha256(data).digest()
