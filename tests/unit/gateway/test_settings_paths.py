"""The files named by settings are made absolute once, when the settings load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.edge.auth import ClientKeys
from gateway.errors import Unauthorized
from gateway.settings import Settings, default_policy_path

ROOT = Path(__file__).resolve().parents[3]


def test_relative_paths_name_the_files_of_the_directory_the_settings_loaded_in(tmp_path, monkeypatch):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    for folder, key in ((home, "home-key"), (elsewhere, "decoy-key")):
        folder.mkdir()
        (folder / "keys.yaml").write_text(yaml.safe_dump([{"key": key}]))
    monkeypatch.chdir(home)
    settings = Settings(policy="policy.yaml", flags_file="flags.json", api_keys_file="keys.yaml")
    monkeypatch.chdir(elsewhere)
    assert (settings.policy, settings.flags_file, settings.api_keys_file) == (
        home / "policy.yaml", home / "flags.json", home / "keys.yaml")
    keys = ClientKeys.load(None, settings.api_keys_file)
    assert keys.authenticate("Bearer home-key") is not None
    with pytest.raises(Unauthorized):
        keys.authenticate("Bearer decoy-key")


def test_a_symlink_is_kept_not_resolved(tmp_path, monkeypatch):
    """A mounted ConfigMap's file is a symlink whose target folder is swapped on update."""
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "policy.yaml").write_text("version: 1\n")
    (tmp_path / "policy.yaml").symlink_to(Path("v1") / "policy.yaml")
    monkeypatch.chdir(tmp_path)
    assert Settings(policy="policy.yaml").policy == tmp_path / "policy.yaml"


def test_an_empty_path_is_none_and_an_empty_policy_the_default(monkeypatch):
    monkeypatch.setenv("SPECGATE_POLICY", "")
    monkeypatch.setenv("SPECGATE_FLAGS_FILE", "")
    settings = Settings()
    assert settings.policy == default_policy_path() and settings.flags_file is None


@pytest.mark.slow  # the command line in a process of its own
@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["--policy", "missing.yaml"], {}, "{tmp}/missing.yaml:1: cannot read policy"),
    (["--policy", "{policy}"], {"SPECGATE_API_KEYS_FILE": "missing-keys.yaml"},
     "specgate serve: SPECGATE_API_KEYS_FILE {tmp}/missing-keys.yaml: cannot read it: No such file or directory"),
])
def test_a_missing_file_is_one_line_naming_its_absolute_path(tmp_path, argv, env, expected):
    argv = [arg.format(policy=ROOT / "policies" / "default.yaml") for arg in argv]
    done = subprocess.run([sys.executable, "-m", "specgate.cli", "serve", "--port", "1", *argv],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(expected.format(tmp=tmp_path)), done.stderr
