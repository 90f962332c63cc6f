"""A request's token loop: draft, verify, stop at EOS or the token limit."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from backends.engine.decoding import Sampling, StepResult, TreeVerifier
from backends.engine.tree import DraftTree


class Drafter(Protocol):
    """Proposes a draft tree rooted at `tokens[-1]`; one instance per sequence."""

    max_depth: int

    def propose(self, tokens: list[int]) -> DraftTree: ...

    def release(self) -> None: ...


class TokenLoop:
    """Generates up to `max_tokens` tokens after `prompt`, speculatively when a
    drafter is given. `step()` returns the tokens the step added (cut at the
    first stop token, which is kept, or at the limit); `finish_reason` is set
    ("stop" or "length") once it is done."""

    def __init__(
        self,
        verifier: TreeVerifier,
        prompt: list[int],
        *,
        max_tokens: int,
        sampling: Sampling = Sampling(),
        drafter: Drafter | None = None,
        stop_ids: Collection[int] = (),
    ) -> None:
        self.verifier = verifier
        self.sampling = sampling
        self.drafter = drafter
        self.stop_ids = frozenset(stop_ids)
        self.max_tokens = max_tokens
        self.state = verifier.start(prompt)
        self.finish_reason: str | None = None if max_tokens > 0 else "length"
        self.last_step: StepResult | None = None

    @property
    def output(self) -> list[int]:
        return self.state.output

    def step(self) -> list[int]:
        if self.finish_reason is not None:
            return []
        tokens = self.state.tokens
        tree = self.drafter.propose(tokens) if self.drafter else DraftTree.root_only(tokens[-1])
        room = self.max_tokens - len(self.output)
        if tree.depth() >= room:  # never verify drafts the limit would throw away
            tree = _cut_depth(tree, room - 1)
        self.last_step = self.verifier.step(self.state, tree, self.sampling)
        new = self.last_step.new_tokens
        for index, token in enumerate(new):
            if token in self.stop_ids:
                new = new[: index + 1]
                self.finish_reason = "stop"
                break
        if len(new) < len(self.last_step.new_tokens):
            del tokens[len(tokens) - len(self.last_step.new_tokens) + len(new) :]
        if self.finish_reason is None and len(self.output) >= self.max_tokens:
            self.finish_reason = "length"
        if self.finish_reason is not None:
            self.close()
        return new

    def run(self) -> list[int]:
        """Step to the end; returns the whole output."""
        while self.finish_reason is None:
            self.step()
        return self.output

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.release()


def _cut_depth(tree: DraftTree, max_depth: int) -> DraftTree:
    depth = [0] * len(tree)
    keep_tokens, keep_parents, renumber = [tree.tokens[0]], [-1], {0: 0}
    for node in range(1, len(tree)):
        parent = tree.parents[node]
        depth[node] = depth[parent] + 1
        if depth[node] <= max_depth and parent in renumber:
            renumber[node] = len(keep_tokens)
            keep_tokens.append(tree.tokens[node])
            keep_parents.append(renumber[parent])
    return DraftTree(keep_tokens, keep_parents)
