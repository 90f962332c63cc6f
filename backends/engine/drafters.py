"""Drafters by name: `ngram` (prompt lookup) or `model:PATH` (a draft model)."""

from __future__ import annotations

from collections.abc import Callable

from backends.engine.generate import Drafter
from backends.engine.ngram import NgramConfig, NgramDrafter


def make_drafter_factory(spec: str) -> Callable[[], Drafter]:
    """A factory of per-request drafters for `spec`."""
    if spec == "ngram":
        return lambda: NgramDrafter(NgramConfig())
    if spec.startswith("model:"):
        from backends.engine.draft_model import DraftModel

        shared = DraftModel.load(spec.removeprefix("model:"))
        return shared.drafter
    raise ValueError(f"unknown drafter {spec!r}: use 'ngram' or 'model:PATH'")
