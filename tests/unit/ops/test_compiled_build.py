"""Which build `specgate serve` loads: a compiled one only while it was made from the sources
as they are now, whole, and before any module it holds was imported; the sources otherwise.
(tests/integration/test_compiled.py builds a real one and checks that it decides as the sources do.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specgate import cli
from specgate.compiled import MANIFEST, CompiledFinder, fingerprint, read_build, use_compiled


def _tree(root: Path) -> Path:
    """A gateway source tree with one module, and a build of it (its extension file a stand-in)."""
    (root / "gateway" / "decide").mkdir(parents=True)
    (root / "gateway" / "decide" / "rule.py").write_text("X = 1\n")
    build = root / "build"
    (build / "gateway" / "decide").mkdir(parents=True)
    (build / "gateway" / "decide" / "rule.so").write_bytes(b"")
    manifest = {"fingerprint": fingerprint(root), "modules": ["gateway.decide.rule"],
                "files": {"gateway.decide.rule": "gateway/decide/rule.so"}}
    (build / MANIFEST).write_text(json.dumps(manifest))
    return build


def test_a_build_made_from_the_sources_as_they_are_is_used(tmp_path):
    build = _tree(tmp_path)
    files, why = read_build(build, tmp_path)
    assert files == {"gateway.decide.rule": build / "gateway/decide/rule.so"} and why == ""


@pytest.mark.parametrize("edit", ["a compiled module", "a module it imports", "a new module"])
def test_any_edit_to_the_sources_makes_the_build_stale(tmp_path, edit):
    build = _tree(tmp_path)
    changed = {"a compiled module": "gateway/decide/rule.py", "a module it imports": "gateway/flags.py",
               "a new module": "gateway/policy/new.py"}[edit]
    (tmp_path / changed).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / changed).write_text("X = 2\n")
    files, why = read_build(build, tmp_path)
    assert files == {} and "stale" in why


@pytest.mark.parametrize("manifest,expected", [
    (None, "no compiled build"),
    ("{not json", "unreadable"),
    ('{"fingerprint": 1}', "unreadable"),
    ('{"fingerprint": "x", "modules": ["gateway.other"], "files": {}}', "unreadable"),
    ('["a list"]', "unreadable"),
])
def test_a_missing_or_broken_manifest_is_said_and_not_used(tmp_path, manifest, expected):
    build = _tree(tmp_path)
    if manifest is None:
        (build / MANIFEST).unlink()
    else:
        (build / MANIFEST).write_text(manifest)
    files, why = read_build(build, tmp_path)
    assert files == {} and expected in why


def test_a_build_missing_a_file_is_not_used(tmp_path):
    build = _tree(tmp_path)
    (build / "gateway/decide/rule.so").unlink()
    files, why = read_build(build, tmp_path)
    assert files == {} and "lacks" in why


def test_off_never_reads_a_build_and_require_refuses_without_one(tmp_path):
    assert not use_compiled("off", tmp_path).compiled
    with pytest.raises(RuntimeError, match="no compiled build"):
        use_compiled("require", tmp_path)
    with pytest.raises(ValueError, match="auto, require, off"):
        use_compiled("sometimes", tmp_path)
    loaded = use_compiled("auto", tmp_path)
    assert not loaded.compiled and "no compiled build" in loaded.why


def test_the_finder_answers_only_for_the_modules_of_its_build(tmp_path):
    finder = CompiledFinder({"gateway.decide.rule": tmp_path / "rule.cpython-311-x86_64-linux-gnu.so"})
    assert finder.find_spec("gateway.decide.other") is None
    spec = finder.find_spec("gateway.decide.rule")
    assert spec is not None and spec.origin == str(tmp_path / "rule.cpython-311-x86_64-linux-gnu.so")
    assert type(spec.loader).__name__ == "ExtensionFileLoader"


def test_serve_with_require_and_no_build_exits_1_saying_why(tmp_path, capsys):
    before = list(sys.meta_path)
    assert cli.main(["serve", "--compiled", "require", "--compiled-dir", str(tmp_path)]) == 1
    assert "no compiled build" in capsys.readouterr().err
    assert sys.meta_path == before


def test_a_manifest_naming_a_file_outside_its_build_is_not_used(tmp_path):
    build = _tree(tmp_path)
    manifest = json.loads((build / MANIFEST).read_text())
    (tmp_path / "elsewhere.so").write_bytes(b"")
    manifest["files"]["gateway.decide.rule"] = "../elsewhere.so"
    (build / MANIFEST).write_text(json.dumps(manifest))
    files, why = read_build(build, tmp_path)
    assert files == {} and "outside" in why


def test_a_build_that_does_not_load_is_dropped_whole(tmp_path):
    """A fresh manifest over a broken extension (here an empty file): auto runs the sources,
    with the finder gone and nothing of the build left imported; require refuses."""
    build = _tree(tmp_path)
    before = list(sys.meta_path)
    loaded = use_compiled("auto", build, tmp_path)
    assert not loaded.compiled and "did not load" in loaded.why
    assert sys.meta_path == before and "gateway.decide.rule" not in sys.modules
    with pytest.raises(RuntimeError, match="did not load"):
        use_compiled("require", build, tmp_path)
    assert sys.meta_path == before
