"""The EAGLE-3 head: shapes, the draft vocabulary maps, training-time test
against cached drafting, and the checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backends.engine.eagle3 import checkpoint
from backends.engine.eagle3.head import Eagle3Head, HeadCache, HeadConfig, TrainingTimeTest

pytestmark = pytest.mark.slow  # torch

SMALL = HeadConfig(hidden_size=32, vocab_size=50, draft_vocab_size=20, layer_ids=(1, 3, 5),
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48)


def small_head(seed: int = 0) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(SMALL)
    head.load_embedding(torch.randn(SMALL.vocab_size, SMALL.hidden_size))
    head.set_draft_vocab(torch.arange(SMALL.draft_vocab_size) * 2 + 5)
    return head.eval()


def test_forward_shapes_and_the_vocabulary_maps() -> None:
    torch.set_num_threads(1)
    head = small_head()
    features = torch.randn(2, 7, 3 * SMALL.hidden_size)
    ids = torch.randint(0, SMALL.vocab_size, (2, 7))
    hidden, logits = head(head.fuse(features), ids, torch.arange(7))
    assert hidden.shape == (2, 7, SMALL.hidden_size)
    assert logits.shape == (2, 7, SMALL.draft_vocab_size) and logits.dtype == torch.float32
    draft = torch.tensor([0, 3, 19])
    assert head.draft_to_target(draft).tolist() == [5, 11, 43]
    assert head.target_to_draft(torch.tensor([5, 11, 43, 6])).tolist() == [0, 3, 19, -1]
    assert int(head.t2d.sum()) == SMALL.draft_vocab_size


def test_the_config_of_a_llama_target() -> None:
    from transformers import LlamaConfig

    target = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, intermediate_size=1536, vocab_size=49152)
    config = HeadConfig.from_target(target, draft_vocab_size=4096)
    assert config.layer_ids == (2, 15, 27)
    assert (config.num_key_value_heads, config.head_dim, config.draft_vocab_size) == (3, 64, 4096)
    with pytest.raises(ValueError, match="draft vocab"):
        HeadConfig.from_target(target, draft_vocab_size=50000)


def test_training_time_test_attends_as_cached_drafting_does() -> None:
    """Step 1 of training-time test at index t equals drafting after token t+1
    with a cache of entries 0..t: the training graph is the inference graph."""
    torch.set_num_threads(1)
    head = small_head()
    length, t = 9, 5
    fused = head.fuse(torch.randn(1, length, 3 * SMALL.hidden_size))
    ids = torch.randint(0, SMALL.vocab_size, (1, length + 1))
    positions = torch.arange(length)[None]
    with torch.no_grad():
        ttt = TrainingTimeTest()
        hidden0, logits0 = head(fused, ids[:, :length], positions, context=ttt)
        hidden1, logits1 = head(hidden0, ids[:, 1:], positions + 1, context=ttt)
        cache = HeadCache()
        cached0, cached_logits0 = head(fused[:, : t + 1], ids[:, : t + 1], positions[:, : t + 1], cache=cache)
        _, cached_logits1 = head(cached0[:, -1:], ids[:, t + 1 : t + 2], torch.tensor([[t + 1]]), cache=cache)
    torch.testing.assert_close(cached_logits0[0], logits0[0, : t + 1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cached_logits1[0, 0], logits1[0, t], rtol=1e-4, atol=1e-4)
    assert len(cache) == t + 2
    cache.crop(t + 1)
    assert len(cache) == t + 1


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    head = small_head(seed=3)
    out = checkpoint.save(head, tmp_path, verifier="tiny-llama", speculative_tokens=4, dtype=torch.float32)
    config = json.loads((out / checkpoint.CONFIG).read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    from safetensors.torch import load_file

    names = set(load_file(str(out / checkpoint.WEIGHTS)))
    assert "embed_tokens.weight" not in names and {"d2t", "t2d", "fc.weight", "lm_head.weight"} <= names
    assert "layers.0.self_attn.q_proj.weight" in names and "layers.0.hidden_norm.weight" in names
    with pytest.raises(ValueError, match="embedding"):
        checkpoint.load(out)
    loaded = checkpoint.load(out, embedding=head.embed_tokens.weight)
    assert loaded.config == head.config
    features = torch.randn(1, 6, 3 * SMALL.hidden_size)
    ids = torch.randint(0, SMALL.vocab_size, (1, 6))
    with torch.no_grad():
        expected = head(head.fuse(features), ids, torch.arange(6))
        got = loaded(loaded.fuse(features), ids, torch.arange(6))
    torch.testing.assert_close(got, expected)
    assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)


def test_a_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no EAGLE-3 head"):
        checkpoint.load(tmp_path)
