"""Drafters by name: `ngram` (prompt lookup), `model:PATH` (a draft model),
`eagle3:PATH` (an EAGLE-3 head) or `eagle3` (the head shipped with the
project for the packaged model)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from backends.engine.generate import Drafter
from backends.engine.ngram import NgramConfig, NgramDrafter
from backends.engine.options import DRAFTER_CHOICES


def make_drafter_factory(spec: str, target: Any = None) -> Callable[[], Drafter]:
    """A factory of per-request drafters for `spec`; an EAGLE-3 head needs the
    `target` model it drafts for."""
    if spec == "ngram":
        return lambda: NgramDrafter(NgramConfig())
    if spec.startswith("model:"):
        from backends.engine.draft_model import DraftModel

        shared = DraftModel.load(spec.removeprefix("model:"))
        return shared.drafter
    if spec == "eagle3" or spec.startswith("eagle3:"):
        from backends.engine.eagle3.drafter import Eagle3Model

        if target is None:
            raise ValueError("an EAGLE-3 drafter needs the target model")
        path = Path(spec.removeprefix("eagle3:")) if spec != "eagle3" else shipped_head()
        return Eagle3Model.load(path, target).drafter
    raise ValueError(f"unknown drafter {spec!r}: use {DRAFTER_CHOICES}")


def shipped_head() -> Path:
    """The head shipped for the packaged model, or a clear error."""
    from backends.engine.eagle3.checkpoint import shipped_head_path

    path = shipped_head_path()
    if not (path / "config.json").is_file():
        raise FileNotFoundError("no EAGLE-3 head is shipped with this installation: "
                                "use --drafter eagle3:PATH with a trained head")
    return path
