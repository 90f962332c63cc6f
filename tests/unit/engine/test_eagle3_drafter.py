"""The engine's EAGLE-3 drafter: EAGLE-2 tree expansion, exact greedy output
with a (random) head from a checkpoint directory, the head's cache across
steps, the drafter option and the vLLM metrics."""

from __future__ import annotations

import argparse
import math

import httpx
import openai
import pytest
import torch
from prometheus_client import CollectorRegistry

from backends.engine import drafters
from backends.engine.decoding import TreeVerifier
from backends.engine.drafters import make_drafter_factory
from backends.engine.eagle3 import checkpoint
from backends.engine.eagle3.drafter import Eagle3Drafter, Eagle3Model
from backends.engine.eagle3.expansion import TreeShape, grow_tree
from backends.engine.eagle3.head import Eagle3Head, HeadCache, HeadConfig
from backends.engine.forward import causal_visibility, fused_inputs, layer_inputs, new_cache, run_model
from backends.engine.generate import DecodeOptions, EngineGenerator, decode
from backends.engine.loading import load_model
from backends.engine.options import drafter_spec
from backends.engine.tree import DraftTree
from backends.serving import VllmMetrics, create_openai_app
from backends.serving.server import BackgroundServer

pytestmark = pytest.mark.slow  # torch

PROMPTS = [
    "What are three good habits for staying healthy?",
    "Summarise in one sentence: the river floods the valley in spring and runs low in summer.",
    "Write a Python function that returns the largest of three numbers.",
]


def logprob_rows(*rows: dict[int, float], width: int = 6) -> torch.Tensor:
    """Rows of log probabilities over `width` tokens; unnamed tokens are very unlikely."""
    out = torch.full((len(rows), width), -50.0)
    for i, row in enumerate(rows):
        for token, logprob in row.items():
            out[i, token] = logprob
    return out


def test_expansion_grows_the_most_probable_nodes_first() -> None:
    calls: list[list[tuple[int, float]]] = []

    def expand(chosen, candidates):
        calls.append([(candidates[i].token, round(candidates[i].score, 3)) for i in chosen])
        # token 1 is confident about 3; token 2 is unsure between 4 and 5
        children = {1: {3: -0.1, 4: -3.0}, 2: {4: -0.7, 5: -0.8}, 3: {0: -0.2, 1: -2.0}}
        return logprob_rows(*(children.get(candidates[i].token, {}) for i in chosen))

    root = logprob_rows({1: -0.2, 2: -1.0, 0: -4.0})[0]
    tree, candidates = grow_tree(9, root, expand, TreeShape(top_k=2, max_depth=3, max_nodes=6, min_prob=0.01))
    # level 1 expands tokens 1 and 2 (not 0); level 2 expands the two best of
    # their four children: 1->3 (-0.3) and 2->4 (-1.7) beat 2->5 (-1.8) and 1->4 (-3.2)
    assert calls == [[(1, -0.2), (2, -1.0)], [(3, -0.3), (4, -1.7)]]
    # 2->4 has no likely child: its children fall below min_prob and are never candidates
    assert len(candidates) == 2 + 4 + 2
    # the five best of all: 1 (-0.2), 1->3 (-0.3), 1->3->0 (-0.5), 2 (-1.0), 2->4 (-1.7)
    assert tree.tokens == [9, 1, 2, 3, 4, 0]
    assert tree.parents == [-1, 0, 0, 1, 2, 3]


def test_expansion_respects_its_bounds() -> None:
    generator = torch.Generator().manual_seed(3)

    def expand(chosen, candidates):
        return torch.log_softmax(torch.randn(len(chosen), 50, generator=generator), dim=-1)

    for shape in (TreeShape(3, 2, 4, 0), TreeShape(4, 5, 16, 0), TreeShape(8, 6, 60, 0), TreeShape(4, 5, 16)):
        root = torch.log_softmax(torch.randn(50, generator=generator), dim=-1)
        tree, candidates = grow_tree(7, root, expand, shape)
        assert len(tree) <= shape.max_nodes and tree.depth() <= shape.max_depth
        assert all(0 <= parent < node for node, parent in enumerate(tree.parents[1:], start=1))
        assert all(c.score >= math.log(shape.min_prob) for c in candidates if shape.min_prob)
    chain, _ = grow_tree(7, root, expand, TreeShape(1, 4, 30, 0))
    assert len(chain) == 5 and chain.depth() == 4  # top_k 1: one path as deep as allowed
    unsure = torch.full((50,), math.log(1 / 50))
    assert grow_tree(7, unsure, expand, TreeShape(min_prob=0.05))[0] == DraftTree.root_only(7)


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(1)
    return load_model("default")


@pytest.fixture(scope="module")
def head_dir(loaded, tmp_path_factory):
    """A randomly initialised head for the packaged model, saved as a checkpoint.
    Its logits are scaled up so that it is sure of its (wrong) drafts and grows
    full trees for the verifier to reject."""
    torch.manual_seed(18)
    head = Eagle3Head(HeadConfig.from_target(loaded.model.config, draft_vocab_size=2048))
    head.set_draft_vocab(torch.randperm(loaded.model.config.vocab_size)[:2048].sort().values)
    with torch.no_grad():
        head.lm_head.weight.mul_(50)
    return checkpoint.save(head, tmp_path_factory.mktemp("eagle3"), verifier="smollm2")


def prompt_ids(loaded, text: str) -> list[int]:
    return list(loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                     add_generation_prompt=True, tokenize=True, return_dict=False))


def test_greedy_with_eagle3_drafts_is_token_for_token_plain_greedy(loaded, head_dir):
    verifier = TreeVerifier(loaded.model)
    factory = make_drafter_factory(f"eagle3:{head_dir}", loaded.model)
    shape = TreeShape()
    prompts = [prompt_ids(loaded, text) for text in PROMPTS] + [prompt_ids(loaded, PROMPTS[0])[:1]]
    for prompt in prompts:
        options = DecodeOptions(max_tokens=24)
        plain = [token for step in decode(verifier, prompt, options) for token in step.tokens]
        drafter = factory()
        assert isinstance(drafter, Eagle3Drafter)
        recording = Recording(drafter)
        steps = list(decode(verifier, prompt, options, recording))
        assert [token for step in steps for token in step.tokens] == plain
        assert len(plain) == 24
        assert sum(tree.num_drafts for tree in recording.trees) >= (shape.max_nodes - 2) * len(recording.trees[1:])
        assert all(len(tree) <= shape.max_nodes and tree.depth() <= shape.max_depth for tree in recording.trees)


class Recording:
    """Passes everything to an EAGLE-3 drafter and keeps the trees it proposed."""

    def __init__(self, drafter: Eagle3Drafter) -> None:
        self.drafter = drafter
        self.aux_layers = drafter.aux_layers
        self.max_depth = drafter.max_depth
        self.trees: list[DraftTree] = []

    def observe(self, features: torch.Tensor) -> None:
        self.drafter.observe(features)

    def propose(self, tokens: list[int]) -> DraftTree:
        self.trees.append(self.drafter.propose(tokens))
        return self.trees[-1]


def test_the_head_cache_holds_what_a_fresh_pass_over_the_sequence_gives(loaded, head_dir):
    """After several steps of drafting and verifying, the head's cached context
    equals one head pass over target features computed from scratch."""
    model = Eagle3Model.load(head_dir, loaded.model)
    drafter = model.drafter()
    prompt = prompt_ids(loaded, PROMPTS[1])
    tokens = prompt + [token for step in decode(TreeVerifier(loaded.model), prompt, DecodeOptions(max_tokens=12),
                                                drafter) for token in step.tokens]
    committed = tokens[: len(drafter.cache) + 1]  # the cache covers all but the last token of these
    with layer_inputs(loaded.model, model.aux_layers) as seen:
        run_model(loaded.model, new_cache(loaded.model), committed[:-1], torch.arange(len(committed) - 1),
                  causal_visibility(0, len(committed) - 1))
    fresh = HeadCache()
    with torch.inference_mode():
        _, logits = model.head(model.head.fuse(fused_inputs(seen, model.aux_layers))[None],
                               torch.tensor([committed[1:]]), torch.arange(len(committed) - 1), fresh)
    assert drafter.cache.keys is not None and fresh.keys is not None
    assert drafter.cache.keys.shape == fresh.keys.shape
    assert torch.allclose(drafter.cache.keys, fresh.keys, atol=1e-3)
    assert torch.allclose(drafter.cache.values, fresh.values, atol=1e-3)


def test_the_drafter_option_names_eagle3_heads(loaded, tmp_path, monkeypatch):
    assert drafter_spec("eagle3") == "eagle3" and drafter_spec("eagle3:heads/a") == "eagle3:heads/a"
    with pytest.raises(argparse.ArgumentTypeError, match="eagle3:PATH"):
        drafter_spec("eagle3:")
    monkeypatch.setattr(checkpoint, "shipped_head_path", lambda: tmp_path / "none")
    with pytest.raises(FileNotFoundError, match="no EAGLE-3 head is shipped"):
        drafters.make_drafter_factory("eagle3", loaded.model)
    with pytest.raises(FileNotFoundError, match="holds no EAGLE-3 head"):
        drafters.make_drafter_factory(f"eagle3:{tmp_path}", loaded.model)
    other = HeadConfig(hidden_size=64, vocab_size=loaded.model.config.vocab_size, draft_vocab_size=16,
                       layer_ids=(1, 2, 3), num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       intermediate_size=96)
    checkpoint.save(Eagle3Head(other), tmp_path / "other", verifier="another model")
    with pytest.raises(ValueError, match="hidden size 64"):
        drafters.make_drafter_factory(f"eagle3:{tmp_path / 'other'}", loaded.model)


def test_the_server_counts_eagle3_drafts_with_vllm_names(loaded, head_dir):
    factory = make_drafter_factory(f"eagle3:{head_dir}", loaded.model)
    metrics = VllmMetrics(CollectorRegistry(), "smollm2", num_speculative_tokens=factory().max_depth)
    generator = EngineGenerator(loaded.model, loaded.tokenizer, metrics, factory)
    with BackgroundServer(create_openai_app(generator, metrics, "smollm2", max_model_len=2048)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        chat = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": PROMPTS[0]}],
                                              temperature=0, max_tokens=16)
        client.close()
        assert chat.usage.completion_tokens == 16
        counters = _counters(httpx.get(server.url + "/metrics").text)
    assert counters["vllm:spec_decode_num_drafts_total"] > 0
    assert counters["vllm:spec_decode_num_draft_tokens_total"] > 0
    assert "vllm:spec_decode_num_accepted_tokens_total" in counters


def _counters(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode") and "{" in line:
            name = line.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values
