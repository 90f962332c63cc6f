"""Prompt-lookup drafting: earlier occurrences of the current suffix in
prompt + output predict what comes next.

The drafter looks for the last `n` tokens (longest `n` first) earlier in the
sequence and takes the tokens that followed each match, most recent match
first. Up to `max_matches` continuations are merged into one tree, so two
earlier passages that diverge become two branches; with `max_matches=1` the
draft is a chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.engine.tree import DraftTree, TrieBuilder


@dataclass(frozen=True)
class NgramConfig:
    """Defaults tuned on a 2-core CPU (docs/benchmarks/engine.md): there scoring 12
    tokens costs ~1.4x one token, so trees stay small; single-token matches
    and up to five merged continuations pay off at that price."""

    max_ngram: int = 4
    min_ngram: int = 1
    max_matches: int = 5
    max_depth: int = 6
    max_nodes: int = 12


@dataclass
class NgramIndex:
    """Positions where each n-gram (1 <= n <= max_ngram) ends, kept up to date
    incrementally as the sequence grows."""

    max_ngram: int
    ends: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    indexed: int = 0  # n-grams ending before this position are in `ends`

    def update(self, tokens: list[int], upto: int) -> None:
        for end in range(self.indexed, upto):
            for n in range(1, min(self.max_ngram, end + 1) + 1):
                key = tuple(tokens[end - n + 1 : end + 1])
                self.ends.setdefault(key, []).append(end)
        self.indexed = max(self.indexed, upto)


class NgramDrafter:
    """Per-sequence prompt-lookup drafter (`propose` is called once per step)."""

    def __init__(self, config: NgramConfig = NgramConfig()) -> None:
        self.config = config
        self.index = NgramIndex(config.max_ngram)

    @property
    def max_depth(self) -> int:
        return self.config.max_depth

    def propose(self, tokens: list[int]) -> DraftTree:
        config = self.config
        last = len(tokens) - 1
        # Matches must end before the suffix itself so that a continuation exists.
        self.index.update(tokens, last)
        builder = TrieBuilder(root=tokens[-1], max_nodes=config.max_nodes)
        seen_starts: set[int] = set()
        matches = 0
        for n in range(min(config.max_ngram, len(tokens)), config.min_ngram - 1, -1):
            for end in reversed(self.index.ends.get(tuple(tokens[last - n + 1 :]), ())):
                start = end + 1
                if start in seen_starts:
                    continue
                seen_starts.add(start)
                builder.add_path(tokens[start : start + config.max_depth])
                matches += 1
                if matches >= config.max_matches or builder.full:
                    return builder.tree
        return builder.tree

    def release(self) -> None:
        """Nothing to free: the index lives and dies with the drafter."""
