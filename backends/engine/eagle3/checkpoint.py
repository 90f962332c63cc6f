"""An EAGLE-3 head as a directory: `config.json` and `model.safetensors`.

The layout is the `speculators` EAGLE-3 format, which vLLM recognises by
`speculators_model_type` and loads with `--speculative-config
'{"method": "eagle3", "model": DIR, "num_speculative_tokens": K}'`:

    config.json        {"speculators_model_type": "eagle3",
                        "architectures": ["Eagle3Speculator"],
                        "transformer_layer_config": {one Llama layer's config},
                        "draft_vocab_size", "target_hidden_size", "norm_before_residual",
                        "eagle_aux_hidden_state_layer_ids",
                        "speculators_config": {"algorithm": "eagle3",
                          "proposal_methods": [{"proposal_type": "greedy",
                                                "speculative_tokens": K, ...}],
                          "verifier": {"name_or_path", "architectures"}}}
    model.safetensors  fc.weight, layers.0.*, norm.weight, lm_head.weight, d2t, t2d

The token embedding is left out: vLLM and `load` share the target's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from backends.engine.eagle3.head import Eagle3Head, HeadConfig

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
SHIPPED_DIR = "shipped"
SHIPPED_NAME = "smollm2-135m-instruct"
_NOT_STORED = ("embed_tokens.weight",)


def shipped_head_path() -> Path:
    """The head shipped for the packaged SmolLM2-135M-Instruct (`--drafter eagle3`)."""
    return Path(__file__).resolve().parent / SHIPPED_DIR / SHIPPED_NAME


def _layer_config(config: HeadConfig) -> dict[str, Any]:
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "num_hidden_layers": 1, "vocab_size": config.vocab_size, "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps, "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    }  # fmt: skip


def config_dict(config: HeadConfig, verifier: str, speculative_tokens: int, dtype: str) -> dict[str, Any]:
    """config.json of a head for the target `verifier` (its name or path)."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": _layer_config(config),
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        "norm_before_residual": config.norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": list(config.layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
        "torch_dtype": dtype,
    }  # fmt: skip


def head_config(data: dict[str, Any]) -> HeadConfig:
    """The `HeadConfig` of a config.json written by `config_dict` (or speculators)."""
    if data.get("speculators_model_type") != "eagle3":
        raise ValueError("not an EAGLE-3 speculators config (speculators_model_type != 'eagle3')")
    layer = data["transformer_layer_config"]
    heads = int(layer["num_attention_heads"])
    rope = layer.get("rope_parameters") or {}
    ids = data.get("eagle_aux_hidden_state_layer_ids") or []
    if len(ids) != 3:
        raise ValueError("eagle_aux_hidden_state_layer_ids must name three target layers")
    return HeadConfig(
        hidden_size=int(layer["hidden_size"]), vocab_size=int(layer["vocab_size"]),
        draft_vocab_size=int(data.get("draft_vocab_size") or layer["vocab_size"]),
        layer_ids=(int(ids[0]), int(ids[1]), int(ids[2])),
        num_attention_heads=heads, num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or int(layer["hidden_size"]) // heads),
        intermediate_size=int(layer["intermediate_size"]), rms_norm_eps=float(layer["rms_norm_eps"]),
        rope_theta=float(rope.get("rope_theta") or layer.get("rope_theta") or 10000.0),
        max_position_embeddings=int(layer.get("max_position_embeddings") or 8192),
        norm_before_residual=bool(data.get("norm_before_residual", True)),
    )  # fmt: skip


def save(head: Eagle3Head, directory: str | os.PathLike[str], verifier: str,
         speculative_tokens: int = 3, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write `head` to `directory` (created); floating tensors are stored as `dtype`."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).contiguous()
        for name, t in head.state_dict().items() if name not in _NOT_STORED
    }  # fmt: skip
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    config = config_dict(head.config, verifier, speculative_tokens, str(dtype).removeprefix("torch."))
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out


def load(directory: str | os.PathLike[str], embedding: torch.Tensor | None = None) -> Eagle3Head:
    """The head stored in `directory`, in float32 and eval mode. `embedding` is the
    target's token embedding, needed unless the checkpoint carries its own."""
    from safetensors.torch import load_file

    path = Path(directory)
    if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
        raise FileNotFoundError(f"{path} holds no EAGLE-3 head ({CONFIG} and {WEIGHTS} expected)")
    head = Eagle3Head(head_config(json.loads((path / CONFIG).read_text(encoding="utf-8"))))
    tensors = {name.replace("midlayer.", "layers.0."): t for name, t in load_file(str(path / WEIGHTS)).items()}
    if "embed_tokens.weight" not in tensors:
        if embedding is None:
            raise ValueError(f"{path} stores no token embedding: pass the target's")
        tensors["embed_tokens.weight"] = embedding
    expected = head.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path}: missing tensors {missing}, unexpected tensors {unexpected}")
    head.load_state_dict({n: t.to(expected[n].dtype) for n, t in tensors.items()})
    return head.eval()
