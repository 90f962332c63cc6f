"""Draft-model drafting with a dynamic tree, in the manner of EAGLE-2.

A small model that shares the target's tokenizer grows the tree level by
level: each level takes the `top_k` most likely children of every frontier
node, keeps the `top_k` candidates with the highest cumulative log
probability across the whole level (so likely branches grow deep and
unlikely ones stop), and runs the draft model once over the kept nodes with a
tree mask to score their children. The draft model keeps its own KV cache of
the committed sequence between steps; the tree's entries are dropped after
each proposal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from backends.engine.forward import cache_length, causal_visibility, crop, extend_chain, new_cache, run_model
from backends.engine.tree import DraftTree


@dataclass
class DraftModel:
    """The draft model itself, shared by every request's drafter."""

    model: Any
    top_k: int = 3
    max_depth: int = 4
    max_nodes: int = 16

    @classmethod
    def load(cls, spec: str) -> DraftModel:
        from backends.engine.loading import load_model

        return cls(load_model(spec).model)

    def drafter(self) -> ModelDrafter:
        return ModelDrafter(self)


@dataclass
class ModelDrafter:
    """One sequence's drafter: the draft model's cache of its committed tokens."""

    draft: DraftModel
    cache: Any = None
    cached: list[int] = field(default_factory=list)

    @property
    def max_depth(self) -> int:
        return self.draft.max_depth

    def propose(self, tokens: list[int]) -> DraftTree:
        model = self.draft.model
        if self.cache is None:
            self.cache = new_cache(model)
        prefix = len(tokens) - 1
        self._sync(tokens[:-1])
        logits = run_model(model, self.cache, [tokens[-1]], torch.tensor([prefix]), causal_visibility(prefix, 1))
        tree = DraftTree.root_only(tokens[-1])
        scores, slots = [0.0], [prefix]
        frontier = [(0, logits[0])]
        for depth in range(1, self.max_depth + 1):
            room = self.draft.max_nodes - len(tree)
            if room <= 0:
                break
            candidates = []
            for node, node_logits in frontier:
                logprobs = torch.log_softmax(node_logits, dim=-1)
                top = torch.topk(logprobs, self.draft.top_k)
                top_k = zip(top.values, top.indices, strict=True)
                candidates += [(scores[node] + float(lp), node, int(tok)) for lp, tok in top_k]
            candidates.sort(key=lambda c: -c[0])
            level = []
            for score, parent, token in candidates[: min(self.draft.top_k, room)]:
                level.append(len(tree))
                tree.tokens.append(token)
                tree.parents.append(parent)
                scores.append(score)
            if depth == self.max_depth or len(tree) >= self.draft.max_nodes:
                break
            start = cache_length(self.cache)
            visible = torch.zeros(len(level), start + len(level), dtype=torch.bool)
            visible[:, :prefix] = True
            for row, node in enumerate(level):
                visible[row, start + row] = True
                ancestor = tree.parents[node]
                while ancestor >= 0:
                    visible[row, slots[ancestor]] = True
                    ancestor = tree.parents[ancestor]
            positions = torch.tensor([prefix + depth] * len(level))
            level_logits = run_model(model, self.cache, [tree.tokens[n] for n in level], positions, visible)
            slots += [start + row for row in range(len(level))]
            frontier = list(zip(level, level_logits, strict=True))
        crop(self.cache, prefix)
        return tree

    def _sync(self, committed: list[int]) -> None:
        """Make the cache hold exactly `committed` (keep the common prefix, extend the rest)."""
        common = 0
        # the two may differ in length: the common prefix ends with the shorter
        for old, new in zip(self.cached, committed, strict=False):
            if old != new:
                break
            common += 1
        crop(self.cache, common)
        if len(committed) > common:
            extend_chain(self.draft.model, self.cache, committed[common:])
        self.cached = list(committed)
