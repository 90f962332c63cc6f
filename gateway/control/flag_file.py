"""Speculation flags on disk: kept across restarts, shared between replicas.

`FlagFile` writes the store's modes and guard verdicts to one JSON file
(temporary file + rename, so readers never see half a file) and watches the
file: when someone else changes it (another replica, an operator, a
Kubernetes ConfigMap mounted as a file) the modes found there are applied.
The file may also be YAML with only modes (`speculative: {mode: force_off}`);
a read-only file is watched and never written. Content this process wrote
or already applied is recognised and not applied again, so replicas do not
echo each other's writes back and forth.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
import yaml

from gateway.flags import FlagStore, Mode, PoolFlag

Signature = tuple[int, int, int]  # (inode, size, mtime_ns)


class FlagFile:
    def __init__(self, path: str | os.PathLike[str], flags: FlagStore) -> None:
        self.path = Path(path)
        self.flags = flags
        self.log = structlog.get_logger("specgate.flags")
        self.writable = True
        self._known: bytes | None = None  # the content last read or written
        self._signature: Signature | None = None
        self._applying = False
        self._dirty = False
        self._wake: asyncio.Event | None = None
        flags.add_listener(self._changed)

    # Start-up ----------------------------------------------------------------

    def restore(self) -> None:
        """Apply the file's modes and guard verdicts (at start-up, before serving)."""
        content = self._read_if_changed()
        if content is not None:
            self._apply(content, verdicts=True)

    # Both directions, synchronously (the watcher runs them off the event loop) -

    def poll(self) -> bool:
        """Apply the file's modes if someone else changed it; True when it did."""
        content = self._read_if_changed()
        if content is None:
            return False
        self._apply(content, verdicts=False)
        return True

    def save(self) -> bool:
        """Write the store to the file if a flag changed here since the last save."""
        if not self._dirty:
            return False
        self._dirty = False
        return self._write(self.render())

    def render(self) -> bytes:
        state = {name: {"mode": flag.mode.value, "guard_enabled": flag.guard_enabled, "reason": flag.reason,
                        "changed_at": flag.changed_at}
                 for name, flag in sorted(self.flags.snapshot().items())}
        return (json.dumps(state, indent=2) + "\n").encode()

    # The watcher task ----------------------------------------------------------

    async def watch(self, interval_s: float) -> None:
        """Poll the file every `interval_s`; write soon after every flag change."""
        self._wake = asyncio.Event()
        while True:
            try:
                content = await asyncio.to_thread(self._read_if_changed)
                if content is not None:
                    self._apply(content, verdicts=False)
                if self._dirty:
                    await asyncio.to_thread(self.save)
            except Exception as exc:  # noqa: BLE001 (keep watching whatever happens)
                self.log.warning("flags_file_error", path=str(self.path), error=f"{type(exc).__name__}: {exc}")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), interval_s)
            except TimeoutError:
                pass

    async def flush(self) -> None:
        await asyncio.to_thread(self.save)

    # Internals -----------------------------------------------------------------

    def _changed(self, pool: str, before: PoolFlag, after: PoolFlag) -> None:
        if self._applying:
            return
        if (before.mode, before.guard_enabled) != (after.mode, after.guard_enabled):
            self._dirty = True
            if self._wake is not None:
                self._wake.set()

    def _read_if_changed(self) -> bytes | None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if signature == self._signature:
            return None
        content = self.path.read_bytes()
        self._signature = signature
        if content == self._known:
            return None
        self._known = content
        return content

    def _write(self, content: bytes) -> bool:
        if not self.writable or content == self._known:
            return False
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            temporary.write_bytes(content)
            os.replace(temporary, self.path)
            stat = self.path.stat()
        except OSError as exc:
            self.writable = False
            temporary.unlink(missing_ok=True)
            self.log.warning("flags_file_read_only", path=str(self.path), error=str(exc),
                             action="watching it, not writing it")
            return False
        self._known = content
        self._signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        return True

    def _apply(self, content: bytes, verdicts: bool) -> None:
        entries = _parse(content, self.path, self.log)
        known = self.flags.snapshot()
        self._applying = True
        try:
            for pool, entry in entries.items():
                if pool not in known:
                    continue
                mode = entry.get("mode")
                if mode is not None:
                    try:
                        self.flags.set_mode(pool, Mode(mode), reason=f"file:{mode}")
                    except ValueError:
                        self.log.warning("flags_file_bad_mode", path=str(self.path), pool=pool, mode=mode)
                guard_enabled = entry.get("guard_enabled")
                if verdicts and isinstance(guard_enabled, bool):
                    self.flags.set_guard(pool, guard_enabled,
                                         f"restored: {entry.get('reason', 'from the flags file')}")
        finally:
            self._applying = False


def _parse(content: bytes, path: Path, log: Any) -> Mapping[str, Mapping[str, Any]]:
    try:
        data = yaml.safe_load(content) or {}
    except (yaml.YAMLError, RecursionError) as exc:  # RecursionError: nested deeper than the parser follows
        log.warning("flags_file_unreadable", path=str(path),
                    error=(str(exc).splitlines() or [type(exc).__name__])[0])
        return {}
    if not isinstance(data, dict):
        log.warning("flags_file_unreadable", path=str(path), error="not a mapping of pool to flags")
        return {}
    entries: dict[str, Mapping[str, Any]] = {}
    for pool, entry in data.items():
        if isinstance(entry, str):
            entry = {"mode": entry}
        if isinstance(entry, dict):
            entries[str(pool)] = entry
    return entries
