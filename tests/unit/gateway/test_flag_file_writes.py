"""The flags file's writes: two writers keep each other's changes, unique temporary
files, a failed write is retried with the next change, the data reaches the disk."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import structlog

from gateway.control.flag_file import FlagFile
from gateway.flags import FlagStore, Mode

POOLS = [f"pool{i}" for i in range(12)]


def writer(path: Path) -> tuple[FlagStore, FlagFile]:
    flags = FlagStore(POOLS)
    file = FlagFile(path, flags)
    file.restore()
    return flags, file


def stored(path: Path) -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = json.loads(path.read_text())
    return data


def test_a_guard_flip_here_does_not_revert_a_mode_set_by_another_writer(tmp_path: Path) -> None:
    path = tmp_path / "flags.json"
    a, file_a = writer(path)
    b, file_b = writer(path)
    b.set_mode("pool0", Mode.FORCE_OFF, reason="admin:force_off")
    assert file_b.save()
    a.set_guard("pool0", False, "low_acceptance: 0.1")  # a has not read b's write yet
    a.set_mode("pool1", Mode.FORCE_ON, reason="admin:force_on")
    assert file_a.save()
    saved = stored(path)
    assert saved["pool0"]["mode"] == "force_off", "b's mode survives a's write"
    assert saved["pool0"]["guard_enabled"] is False and saved["pool1"]["mode"] == "force_on"
    assert file_a.poll() and a.get("pool0").mode is Mode.FORCE_OFF, "a learns b's mode from its own write"
    assert file_b.poll() and b.get("pool1").mode is Mode.FORCE_ON


def test_concurrent_writers_lose_nothing_and_leave_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "flags.json"
    writers = [writer(path) for _ in range(4)]
    start = threading.Barrier(len(writers))

    def run(index: int) -> None:
        flags, file = writers[index]
        start.wait()
        for pool in POOLS[index::len(writers)]:
            flags.set_mode(pool, Mode.FORCE_OFF, reason="admin:force_off")
            assert file.save()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {pool: entry["mode"] for pool, entry in stored(path).items()} == dict.fromkeys(POOLS, "force_off")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".flags.json.lock", "flags.json"]


def test_a_failed_write_is_retried_with_the_next_change_and_warns_once(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "flags.json"  # its directory does not exist yet
    flags, file = writer(path)
    with structlog.testing.capture_logs() as logs:
        flags.set_mode("pool0", Mode.FORCE_OFF, reason="admin:force_off")
        assert not file.save() and not file.writable
        flags.set_mode("pool1", Mode.FORCE_ON, reason="admin:force_on")
        assert not file.save()
        path.parent.mkdir()
        flags.set_mode("pool2", Mode.FORCE_OFF, reason="admin:force_off")
        assert file.save() and file.writable
    events = [entry["event"] for entry in logs]
    assert events.count("flags_file_not_written") == 1 and events.count("flags_file_written_again") == 1
    saved = stored(path)
    assert (saved["pool0"]["mode"], saved["pool1"]["mode"], saved["pool2"]["mode"]) == (
        "force_off", "force_on", "force_off"), "the failed writes' changes are kept and written"


def test_nothing_to_write_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "flags.json"
    flags, file = writer(path)
    assert not file.save() and not path.exists()
    flags.set_mode("pool0", Mode.FORCE_ON, reason="admin:force_on")
    assert file.save() and not file.save()


def test_the_file_and_its_directory_are_fsynced_before_and_after_the_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "flags.json"
    synced: list[tuple[str, bool]] = []  # (what the descriptor is, whether flags.json existed then)
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        target = os.readlink(f"/proc/self/fd/{descriptor}")
        synced.append((Path(target).name if Path(target) != tmp_path else "directory", path.exists()))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    flags, file = writer(path)
    flags.set_mode("pool0", Mode.FORCE_OFF, reason="admin:force_off")
    assert file.save()
    assert len(synced) == 2
    (temporary, existed_before), (directory, existed_after) = synced
    assert temporary.startswith(".flags.json.") and temporary.endswith(".tmp") and not existed_before
    assert directory == "directory" and existed_after
