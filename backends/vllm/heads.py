"""Draft heads a launch profile names by placeholder instead of by path.

`speculative-eagle3-local` drafts with the EAGLE-3 head shipped for the
packaged SmolLM2-135M-Instruct. The head's directory is already in the layout
vLLM loads (`speculators` EAGLE-3: `config.json` with
`speculators_model_type: eagle3`, `model.safetensors` with `fc`, `layers.0.*`,
`norm`, `lm_head`, `d2t`, `t2d`), so the profile points vLLM at it directly.
The path is found without importing the engine (no torch at render time).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SHIPPED_EAGLE3 = "{shipped-eagle3-head}"
_HEAD_PACKAGE = "backends.engine.eagle3"
_SHIPPED = ("shipped", "smollm2-135m-instruct")


class HeadNotFound(RuntimeError):
    """The profile names a head this installation does not carry."""


def shipped_eagle3_head() -> Path:
    """The shipped head's directory; HeadNotFound when the package has none."""
    spec = importlib.util.find_spec(_HEAD_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise HeadNotFound(f"{_HEAD_PACKAGE} is not installed: no EAGLE-3 head is shipped with this installation")
    head = Path(next(iter(spec.submodule_search_locations))).joinpath(*_SHIPPED)
    missing = [name for name in ("config.json", "model.safetensors") if not (head / name).is_file()]
    if missing:
        raise HeadNotFound(f"no EAGLE-3 head is shipped with this installation ({', '.join(missing)} missing "
                           f"in {head})")
    return head


def resolve_heads(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with the placeholder of a shipped head replaced by its directory."""
    resolved = dict(config)
    if resolved.get("model") == SHIPPED_EAGLE3:
        resolved["model"] = str(shipped_eagle3_head())
    return resolved
