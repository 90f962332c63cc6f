"""The `speculative-eagle3-local` profile: its placeholder, the shipped head read
by vLLM's own config code, and how `specgate up` chooses the profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from backends.vllm import heads, load_profiles, render
from specgate.replicas import vllm_backends
from specgate.up import StartError

ROOT = Path(__file__).resolve().parents[3]
PROFILE = "speculative-eagle3-local"


def rendered_config(profile: str = PROFILE) -> dict:
    _, profiles = load_profiles()
    argv = render(profiles[profile], model="m", python="python3")
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_placeholder_renders_to_the_shipped_head():
    config = rendered_config()
    assert config["method"] == "eagle3" and config["num_speculative_tokens"] == 2
    head = Path(config["model"])
    assert head == ROOT / "backends" / "engine" / "eagle3" / "shipped" / "smollm2-135m-instruct"
    assert (head / "config.json").is_file() and (head / "model.safetensors").is_file()


@pytest.mark.slow
def test_vllm_reads_the_shipped_head_as_an_eagle3_llama_drafter():
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    head = heads.shipped_eagle3_head()
    raw = json.loads((head / "config.json").read_text())
    assert SpeculatorsConfig.extract_vllm_speculative_config(raw)["method"] == "eagle3"
    config = SpeculatorsConfig.from_pretrained(str(head))
    assert config.architectures == ["Eagle3LlamaForCausalLM"]
    assert (config.draft_vocab_size, config.target_hidden_size, config.num_hidden_layers) == (4096, 576, 1)
    assert list(config.eagle_aux_hidden_state_layer_ids) == [2, 15, 27]  # SmolLM2's (2, L/2, L-3)


@pytest.mark.slow
def test_shipped_tensors_are_the_names_and_mapping_vllm_loads():
    import torch

    with safe_open(str(heads.shipped_eagle3_head() / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        d2t, t2d = weights.get_tensor("d2t"), weights.get_tensor("t2d")
    layer = {f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"} | {
        f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")} | {
        f"layers.0.{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm")}
    assert names == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | layer
    # vLLM maps draft id i to target id i + d2t[i] (Eagle3LlamaForCausalLM.compute_logits)
    targets = torch.arange(len(d2t)) + d2t
    assert bool((targets[1:] > targets[:-1]).all()) and int(targets[-1]) < len(t2d)
    assert torch.equal(torch.nonzero(t2d).flatten(), targets)


def test_a_missing_head_is_a_clear_start_error(monkeypatch, tmp_path):
    monkeypatch.setattr(heads, "_SHIPPED", ("shipped", "not-there"))
    with pytest.raises(heads.HeadNotFound, match="no EAGLE-3 head is shipped"):
        rendered_config()
    with pytest.raises(StartError, match=f"profile {PROFILE}: no EAGLE-3 head is shipped"):
        vllm_backends(tmp_path, tmp_path, (1, 2), speculative_profile=PROFILE)


def test_up_drafts_with_the_shipped_head_unless_told_otherwise(tmp_path):
    spec, std = vllm_backends(tmp_path, tmp_path, (8001, 8002), python="python3")
    config = json.loads(spec.argv[spec.argv.index("--speculative-config") + 1])
    assert config["method"] == "eagle3" and Path(config["model"]) == heads.shipped_eagle3_head()
    assert "--speculative-config" not in std.argv
    ngram, _ = vllm_backends(tmp_path, tmp_path, (8001, 8002), "python3", speculative_profile="speculative-ngram")
    assert '"method": "ngram"' in ngram.argv[ngram.argv.index("--speculative-config") + 1]
    for wrong in ("standard", "no-such-profile"):
        with pytest.raises(StartError, match="choose one of: .*speculative-eagle3-local"):
            vllm_backends(tmp_path, tmp_path, (8001, 8002), speculative_profile=wrong)


@pytest.mark.slow
def test_up_help_names_the_local_eagle3_profile():
    out = subprocess.run([sys.executable, "-m", "specgate.cli", "up", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True, env={**os.environ, "COLUMNS": "300"}).stdout  # one line each
    assert "--speculative-profile" in out and "(default: speculative-eagle3-local;" in out
