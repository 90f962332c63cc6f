"""Flags on disk: persistence across restarts and sharing between stores."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable

import pytest

from gateway.control.flag_file import FlagFile
from gateway.flags import FlagStore, Mode


def store_with_file(path) -> tuple[FlagStore, FlagFile]:
    flags = FlagStore(["speculative", "draft"])
    file = FlagFile(path, flags)
    file.restore()
    return flags, file


def test_a_restart_keeps_modes_and_guard_verdicts(tmp_path):
    path = tmp_path / "flags.json"
    flags, file = store_with_file(path)
    flags.set_mode("speculative", Mode.FORCE_OFF, reason="admin:force_off")
    flags.set_guard("draft", False, "low_acceptance: 0.2")
    assert file.save()
    saved = json.loads(path.read_text())
    assert saved["speculative"]["mode"] == "force_off" and saved["draft"]["guard_enabled"] is False

    again, _ = store_with_file(path)
    assert again.get("speculative").mode is Mode.FORCE_OFF
    assert again.get("draft").guard_enabled is False
    assert again.get("draft").reason.startswith("restored: low_acceptance")


def test_two_stores_share_modes_through_the_file(tmp_path):
    path = tmp_path / "flags.json"
    a, file_a = store_with_file(path)
    b, file_b = store_with_file(path)
    a.set_mode("speculative", Mode.FORCE_ON, reason="admin:force_on")
    file_a.save()
    assert file_b.poll()
    assert b.get("speculative").mode is Mode.FORCE_ON and b.get("speculative").reason == "file:force_on"
    assert not file_b.save(), "applying the file's modes is not a change to write back"
    assert not file_a.poll(), "a's own write is not news to a"
    b.set_guard("draft", False, "stale: no metrics")
    assert file_b.save()
    assert file_a.poll()
    assert a.get("draft").guard_enabled is True, "guard verdicts are each replica's own"
    assert a.get("speculative").mode is Mode.FORCE_ON


def test_yaml_modes_from_a_mounted_configmap_and_bad_entries(tmp_path):
    path = tmp_path / "flags.yaml"
    path.write_text("# pool: {mode: auto | force_on | force_off}\nspeculative: {mode: force_off}\n"
                    "draft: {mode: sometimes}\nghost: {mode: force_on}\n")
    flags, file = store_with_file(path)
    assert flags.get("speculative").mode is Mode.FORCE_OFF
    assert flags.get("draft").mode is Mode.AUTO
    path.write_text("speculative: auto\n")
    assert file.poll() and flags.get("speculative").mode is Mode.AUTO
    path.write_text("[not, a, mapping]\n")
    assert file.poll() and flags.get("speculative").mode is Mode.AUTO


def test_a_file_nested_deeper_than_the_parser_follows_is_ignored(tmp_path):
    path = tmp_path / "flags.yaml"
    path.write_text("speculative: " + "[" * 5000 + "]" * 5000 + "\n")
    flags, file = store_with_file(path)  # at start-up: must not raise
    assert flags.get("speculative").mode is Mode.AUTO
    path.write_text("speculative: {mode: force_off}\n")
    assert file.poll() and flags.get("speculative").mode is Mode.FORCE_OFF


def test_a_read_only_file_is_watched_not_written(tmp_path):
    directory = tmp_path / "configmap"
    directory.mkdir()
    path = directory / "flags.yaml"
    path.write_text("speculative: {mode: auto}\n")
    os.chmod(directory, 0o555)
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("running as root: file permissions do not bind")
        flags, file = store_with_file(path)
        flags.set_mode("speculative", Mode.FORCE_OFF, reason="admin:force_off")
        assert not file.save() and not file.writable
        assert path.read_text() == "speculative: {mode: auto}\n"
    finally:
        os.chmod(directory, 0o755)


def test_the_watcher_writes_changes_and_applies_others(tmp_path):
    path = tmp_path / "flags.json"

    async def until(predicate: Callable[[], bool]) -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    async def scenario() -> tuple[Mode, Mode]:
        a, file_a = store_with_file(path)
        b, file_b = store_with_file(path)
        tasks = [asyncio.create_task(file_a.watch(0.02)), asyncio.create_task(file_b.watch(0.02))]
        try:
            a.set_mode("draft", Mode.FORCE_OFF, reason="admin:force_off")
            # 30 s only guards against a hang: the event comes within a few polls.
            await asyncio.wait_for(until(lambda: b.get("draft").mode is Mode.FORCE_OFF), 30)
            b.set_mode("speculative", Mode.FORCE_ON, reason="admin:force_on")
            await asyncio.wait_for(until(lambda: a.get("speculative").mode is Mode.FORCE_ON), 30)
            assert not any(task.done() for task in tasks), "the watchers keep running"
            return b.get("draft").mode, a.get("speculative").mode
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    assert asyncio.run(scenario()) == (Mode.FORCE_OFF, Mode.FORCE_ON)
    saved = json.loads(path.read_text())
    assert saved["draft"]["mode"] == "force_off" and saved["speculative"]["mode"] == "force_on"
