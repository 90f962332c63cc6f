"""EAGLE-3 drafting: the head grows a dynamic draft tree from the target's
own hidden states (`expansion.grow_tree`), verified like any other tree.

Each sequence's drafter keeps the head's KV cache of the committed context:
entry t holds the fused target features of token t and the embedding of token
t+1, so the last entry (t = n-2 for n committed tokens) predicts the root's
children. Before each proposal the drafter appends the entries of the tokens
the target just committed (their features come from the verify pass), then
runs the head over the tree level by level: a draft node at depth d is the
entry at position n-2+d, fed its parent's head output and its own token, and
sees the context plus its ancestors' entries. The tree's entries are dropped
after the proposal, so the cache only ever holds entries made from real
target features.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from backends.engine.eagle3.expansion import Candidate, TreeShape, grow_tree
from backends.engine.eagle3.head import Eagle3Head, HeadCache, HeadConfig
from backends.engine.tree import DraftTree


@dataclass
class Eagle3Model:
    """The head, shared by every request's drafter."""

    head: Eagle3Head
    shape: TreeShape = TreeShape()
    vocab: torch.Tensor = field(init=False, repr=False)  # draft id -> target id

    def __post_init__(self) -> None:
        self.head.eval()
        with torch.inference_mode():
            self.vocab = self.head.draft_to_target(torch.arange(self.head.config.draft_vocab_size))

    @classmethod
    def load(cls, path: str | Path, target: Any, shape: TreeShape | None = None) -> Eagle3Model:
        """The head at `path` for `target` (whose token embedding it shares),
        its linear layers packed for inference like the target's."""
        from backends.engine.eagle3.checkpoint import CONFIG, head_config, load
        from backends.engine.packing import pack_linear_layers

        config_file = Path(path) / CONFIG
        if config_file.is_file():  # else `load` says what is missing
            check_fits(head_config(json.loads(config_file.read_text(encoding="utf-8"))), target)
        head = load(path, embedding=target.get_input_embeddings().weight)
        pack_linear_layers(head)
        return cls(head, shape or TreeShape())

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return tuple(self.head.config.layer_ids)

    def drafter(self) -> Eagle3Drafter:
        return Eagle3Drafter(self)


def check_fits(config: HeadConfig, target: Any) -> None:
    """A clear error when the head was trained for another model's shape."""
    target_config = target.config
    if config.hidden_size != target_config.hidden_size or config.vocab_size != target_config.vocab_size:
        raise ValueError(f"the EAGLE-3 head expects hidden size {config.hidden_size} and vocabulary "
                         f"{config.vocab_size}; the model has {target_config.hidden_size} and "
                         f"{target_config.vocab_size}")
    if max(config.layer_ids) >= target_config.num_hidden_layers:
        raise ValueError(f"the EAGLE-3 head reads layers {config.layer_ids}; the model has "
                         f"{target_config.num_hidden_layers}")


@dataclass
class Eagle3Drafter:
    """One sequence's drafter: the head's cache of its committed context."""

    model: Eagle3Model
    cache: HeadCache = field(default_factory=HeadCache)
    pending: list[torch.Tensor] = field(default_factory=list)  # observed features not yet in the cache
    last_hidden: torch.Tensor | None = None  # head output of the last context entry `[H]`
    last_logprobs: torch.Tensor | None = None  # its draft log probabilities (the root's children)
    last_candidates: list[Candidate] = field(default_factory=list)  # of the last proposal

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return self.model.aux_layers

    @property
    def max_depth(self) -> int:
        return self.model.shape.max_depth

    def observe(self, features: torch.Tensor) -> None:
        """Fused-layer inputs `[m, 3H]` of the next m committed tokens."""
        self.pending.append(features)

    def propose(self, tokens: list[int]) -> DraftTree:
        with torch.inference_mode():
            self._extend_context(tokens)
            if self.last_hidden is None or self.last_logprobs is None:  # a one-token prompt: no features yet
                return DraftTree.root_only(tokens[-1])
            context = len(self.cache)
            slots: dict[int, int] = {}
            hiddens: dict[int, torch.Tensor] = {}

            def expand(chosen: list[int], candidates: list[Candidate]) -> torch.Tensor:
                return self._expand(chosen, candidates, context, slots, hiddens)

            tree, self.last_candidates = grow_tree(tokens[-1], self.last_logprobs, expand, self.model.shape,
                                                   self.model.vocab)
            self.cache.crop(context)
        return tree

    def _extend_context(self, tokens: list[int]) -> None:
        """Append the entries of the newly committed tokens: entry t pairs the
        features of token t with token t+1, for t up to len(tokens) - 2."""
        if not self.pending:
            return
        features = torch.cat(self.pending)
        self.pending.clear()
        start = len(self.cache)
        if start + len(features) != len(tokens) - 1:
            raise RuntimeError(f"the head holds {start} entries and got {len(features)} more for "
                               f"{len(tokens)} tokens")
        if not len(features):
            return
        head = self.model.head
        ids = torch.tensor([tokens[start + 1 :]], dtype=torch.long)
        positions = torch.arange(start, start + len(features))
        hidden, logits = head(head.fuse(features)[None], ids, positions, self.cache)
        self.last_hidden = hidden[0, -1]
        self.last_logprobs = torch.log_softmax(logits[0, -1], dim=-1)

    def _expand(self, chosen: list[int], candidates: list[Candidate], context: int,
                slots: dict[int, int], hiddens: dict[int, torch.Tensor]) -> torch.Tensor:
        """Run the head over `chosen` tree nodes at once, each seeing the
        context, its ancestors' entries and itself; returns their children's
        draft log probabilities."""
        assert self.last_hidden is not None
        start, count = len(self.cache), len(chosen)
        visible = torch.zeros(count, start + count, dtype=torch.bool)
        visible[:, :context] = True
        for row, index in enumerate(chosen):
            visible[row, start + row] = True
            ancestor = candidates[index].parent
            while ancestor >= 0:
                visible[row, slots[ancestor]] = True
                ancestor = candidates[ancestor].parent
        parent_hidden = [hiddens.get(candidates[i].parent, self.last_hidden) for i in chosen]
        ids = torch.tensor([[candidates[i].token for i in chosen]], dtype=torch.long)
        positions = torch.tensor([context - 1 + candidates[i].depth for i in chosen])
        hidden, logits = self.model.head(torch.stack(parent_hidden)[None], ids, positions, self.cache, visible)
        for row, index in enumerate(chosen):
            slots[index] = start + row
            hiddens[index] = hidden[0, row]
        return torch.log_softmax(logits[0], dim=-1)
