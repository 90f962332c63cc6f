"""Speculation flags on disk: kept across restarts, shared between processes on one host.

`FlagFile` writes the store's modes and guard verdicts to one JSON file and
watches the file: when someone else changes it (another process, an
operator, a Kubernetes ConfigMap mounted as a file) the modes found there
are applied. The file may also be YAML with only modes
(`speculative: {mode: force_off}`). Content this process wrote or already
applied is recognised and not applied again, so processes do not echo each
other's writes back and forth.

A write changes only what changed here: under a lock on a sidecar file
(`.NAME.lock`), it reads the file, replaces the changed pools' mode or guard
fields and nothing else, writes a uniquely named temporary file in the same
directory, fsyncs it, renames it over the file and fsyncs the directory. So
two writers do not lose each other's changes, and a crash leaves the old
file or the new one. A failed write (a read-only ConfigMap, a full disk) is
retried with the next change; it warns once until a write succeeds again.

Several replicas on several hosts share modes through the state store
instead (`gateway/state/overrides.py`). With a store the file only gives the
initial modes and verdicts: `restore_initial` applies it once at start-up, and
it is never watched or written (the store holds what changes), so a read-only
mount is fine and warns about nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import structlog
import yaml

from gateway.flags import FlagStore, Mode, PoolFlag

Signature = tuple[int, int, int]  # (inode, size, mtime_ns)

MODE_FIELDS = ("mode",)
GUARD_FIELDS = ("guard_enabled", "reason", "changed_at")


def restore_initial(path: str | os.PathLike[str], flags: FlagStore) -> None:
    """Apply the file's modes and verdicts once, without following the flags (with a state store)."""
    FlagFile(path, flags, follow=False).restore()


class FlagFile:
    def __init__(self, path: str | os.PathLike[str], flags: FlagStore, follow: bool = True) -> None:
        self.path = Path(path)
        self.flags = flags
        self.log = structlog.get_logger("specgate.flags")
        self.writable = True  # the last write went through
        self._known: bytes | None = None  # the content last read or written
        self._signature: Signature | None = None
        self._applying = False
        self._due = False  # a flag changed here since the last write attempt
        self._unsaved: dict[str, set[str]] = {}  # pool -> fields changed here, not yet on disk
        self._unapplied: bytes | None = None  # written content that carried others' changes
        self._lock = threading.Lock()  # the listener (event loop) and a write (a thread)
        self._wake: asyncio.Event | None = None
        if follow:  # record the changes made here, for `save`
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
        content, self._unapplied = self._unapplied, None
        content = self._read_if_changed() or content
        if content is None:
            return False
        self._apply(content, verdicts=False)
        return True

    def save(self, force: bool = False) -> bool:
        """Write what changed here since the last write (a failed one's too) when a
        flag changed since the last attempt, or when `force`; True when written."""
        with self._lock:
            if not (self._due or force) or not self._unsaved:
                self._due = False
                return False
            self._due = False
            changes, self._unsaved = self._unsaved, {}
        try:
            self._write_changes(changes)
        except OSError as exc:
            with self._lock:
                for pool, fields in changes.items():
                    self._unsaved.setdefault(pool, set()).update(fields)
            if self.writable:
                self.log.warning("flags_file_not_written", path=str(self.path), error=str(exc),
                                 action="keeping the changes; trying again with the next one")
            self.writable = False
            return False
        if not self.writable:
            self.log.info("flags_file_written_again", path=str(self.path))
        self.writable = True
        return True

    def render(self, entries: Mapping[str, Mapping[str, Any]], changes: Mapping[str, set[str]]) -> bytes:
        """The file's entries with the changed fields of the changed pools replaced."""
        merged = {pool: dict(entry) for pool, entry in entries.items()}
        snapshot = self.flags.snapshot()
        for pool, fields in changes.items():
            flag = snapshot.get(pool)
            if flag is not None:
                values = {"mode": flag.mode.value, "guard_enabled": flag.guard_enabled, "reason": flag.reason,
                          "changed_at": flag.changed_at}
                merged.setdefault(pool, {}).update({name: values[name] for name in fields})
        return (json.dumps(dict(sorted(merged.items())), indent=2) + "\n").encode()

    # The watcher task ----------------------------------------------------------

    async def watch(self, interval_s: float) -> None:
        """Poll the file every `interval_s`; write soon after every flag change."""
        self._wake = asyncio.Event()
        while True:
            try:
                content = await asyncio.to_thread(self._read_if_changed)
                content, self._unapplied = content or self._unapplied, None
                if content is not None:
                    self._apply(content, verdicts=False)
                if self._due:
                    await asyncio.to_thread(self.save)
            except Exception as exc:  # noqa: BLE001 (keep watching whatever happens)
                self.log.warning("flags_file_error", path=str(self.path), error=f"{type(exc).__name__}: {exc}")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), interval_s)
            except TimeoutError:
                pass

    async def flush(self) -> None:
        """At shutdown: one more try for whatever is not on disk yet."""
        await asyncio.to_thread(self.save, True)

    # Internals -----------------------------------------------------------------

    def _changed(self, pool: str, before: PoolFlag, after: PoolFlag) -> None:
        if self._applying:
            return
        fields = (MODE_FIELDS if before.mode != after.mode else ()) + (
            GUARD_FIELDS if before.guard_enabled != after.guard_enabled else ())
        if fields:
            with self._lock:
                self._unsaved.setdefault(pool, set()).update(fields)
                self._due = True
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

    def _write_changes(self, changes: Mapping[str, set[str]]) -> None:
        """Read, merge and replace the file under the lock; OSError when it cannot."""
        with _locked(self.path.with_name(f".{self.path.name}.lock")):
            try:
                current = self.path.read_bytes()
            except FileNotFoundError:
                current = b""
            content = self.render(_parse(current, self.path, self.log) if current else {}, changes)
            _replace(self.path, content)
            stat = self.path.stat()
        if current != self._known and current:
            self._unapplied = content  # others' changes came with it: apply them on the next poll
        self._known = content
        self._signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)

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


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive lock between processes (flock on a sidecar file, which stays)."""
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _replace(path: Path, content: bytes) -> None:
    """Write `content` to a unique temporary file beside `path`, fsync it, rename
    it over `path`, fsync the directory: readers see the old file or the new one."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
