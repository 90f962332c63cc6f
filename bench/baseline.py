"""A commit's tree to measure beside today's: its files exported, and its request path compiled as it shipped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export_tree(ref: str, into: Path) -> Path:
    """The project's files at commit `ref`, in a folder of their own."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def compile_tree(tree: Path, env: dict[str, str]) -> bool:
    """The tree's own compiled build (`specgate compile`, in its build/compiled), as that commit
    shipped it; False, and the tree runs its sources, for a commit from before the command."""
    if not (tree / "specgate" / "compiled.py").exists():
        print(f"{tree} has no `specgate compile`: it runs its sources", file=sys.stderr)
        return False
    print(f"compiling {tree}'s build (several minutes on 2 cores)...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "specgate.cli", "compile"], cwd=tree, env={**env, "PYTHONPATH": str(tree)},
                   check=True)
    return True
