"""One decoding step of one sequence: verify a draft tree with the target.

The cache holds every committed token but the last (the root). A step writes
the tree's KV at slots `seq_len + i` in one forward pass with the tree mask
and position ids from `build_tree`, picks the accepted path with
`verify_greedy` (temperature 0) or `verify_sampling`, keeps the accepted
entries with `compact_kv` and crops the rest. A root-only tree is plain
decoding: one token per step through the same code.

A sequence started with `aux_layers` (an EAGLE-3 drafter's) also keeps the
target's hidden states entering those layers for the tokens each pass
committed to the cache, in `SequenceState.features`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from backends.engine.forward import extend_chain, fused_inputs, keep_accepted, layer_inputs, new_cache, run_model
from backends.engine.tree import DraftTree
from backends.kernels import build_tree, processed_probs, verify_greedy, verify_sampling


@dataclass(frozen=True)
class Sampling:
    """Temperature 0 is greedy; otherwise the target's processed distribution
    is sampled exactly, with coins from `generator`."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @classmethod
    def create(cls, temperature: float, top_k: int, top_p: float, seed: int | None) -> Sampling:
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        return cls(temperature, top_k, top_p, generator)


@dataclass
class SequenceState:
    """A sequence in the target model: committed tokens and their KV cache."""

    tokens: list[int]
    prompt_len: int
    cache: Any = field(repr=False)
    aux_layers: tuple[int, ...] = ()
    # with aux_layers: `[m, len(aux_layers) * H]`, the fused layer inputs of
    # the m tokens the last prefill or step added to the cache (its last m slots)
    features: torch.Tensor | None = field(default=None, repr=False)

    @property
    def seq_len(self) -> int:
        """Tokens in the cache: all but the root."""
        return len(self.tokens) - 1

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]


@dataclass(frozen=True)
class StepResult:
    new_tokens: list[int]  # accepted drafts then the bonus token
    num_drafts: int  # draft tokens verified
    accepted: int  # draft tokens accepted


class TreeVerifier:
    """Runs the target model over prompts and draft trees."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def start(self, prompt: list[int], aux_layers: tuple[int, ...] = ()) -> SequenceState:
        """Prefill every prompt token but the last, which is the first root."""
        if not prompt:
            raise ValueError("the prompt is empty")
        state = SequenceState(tokens=list(prompt), prompt_len=len(prompt), cache=new_cache(self.model),
                              aux_layers=aux_layers)
        with layer_inputs(self.model, aux_layers) as seen:
            if len(prompt) > 1:
                extend_chain(self.model, state.cache, prompt[:-1])
        if aux_layers:
            width = len(aux_layers) * self.model.config.hidden_size
            state.features = fused_inputs(seen, aux_layers) if seen else torch.zeros(0, width)
        return state

    def step(self, state: SequenceState, tree: DraftTree, sampling: Sampling) -> StepResult:
        seq_len, n = state.seq_len, len(tree)
        parents = torch.tensor([tree.parents], dtype=torch.long)
        seq_lens = torch.tensor([seq_len], dtype=torch.long)
        num_nodes = torch.tensor([n], dtype=torch.long)
        layout = build_tree(parents, seq_lens, num_nodes)
        visible = torch.cat([torch.ones(n, seq_len, dtype=torch.bool), layout.attn_mask[0]], dim=1)
        with layer_inputs(self.model, state.aux_layers) as seen:
            logits = run_model(self.model, state.cache, tree.tokens, layout.position_ids[0], visible)
        draft_tokens = torch.tensor([tree.tokens], dtype=torch.long)
        if sampling.greedy:
            result = verify_greedy(draft_tokens, logits.argmax(dim=-1)[None], layout, num_nodes)
        else:
            probs = processed_probs(logits[None], sampling.temperature, sampling.top_k, sampling.top_p)
            uniforms = torch.rand(1, n, generator=sampling.generator)
            bonus = torch.rand(1, generator=sampling.generator)
            result = verify_sampling(draft_tokens, probs, layout, num_nodes, uniforms, bonus)
        keep_accepted(state.cache, seq_len, result.accepted_nodes, result.accept_len)
        accepted = int(result.accept_len[0])
        if state.aux_layers:  # the root and the accepted drafts are now cached
            state.features = fused_inputs(seen, state.aux_layers)[result.accepted_nodes[0, : accepted + 1]]
        path = result.accepted_nodes[0, 1 : accepted + 1].tolist()
        new_tokens = [tree.tokens[node] for node in path] + [int(result.bonus_token[0])]
        state.tokens.extend(new_tokens)
        return StepResult(new_tokens=new_tokens, num_drafts=tree.num_drafts, accepted=accepted)
