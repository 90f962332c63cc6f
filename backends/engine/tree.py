"""Draft trees: node 0 is the root (the last committed token), every other
node a draft token whose parent comes earlier (the kernels' convention)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class DraftTree:
    """Tokens and parent links of one draft tree, in topological order."""

    tokens: list[int]
    parents: list[int]

    @classmethod
    def root_only(cls, root: int) -> DraftTree:
        return cls(tokens=[root], parents=[-1])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_drafts(self) -> int:
        return len(self.tokens) - 1

    def depths(self) -> list[int]:
        depths = [0] * len(self.tokens)
        for node in range(1, len(self.tokens)):
            depths[node] = depths[self.parents[node]] + 1
        return depths

    def depth(self) -> int:
        return max(self.depths())

    def pruned(self, max_depth: int) -> DraftTree:
        """The nodes at most `max_depth` below the root (parents renumbered)."""
        depths = self.depths()
        if max(depths) <= max_depth:
            return self
        kept = [node for node, depth in enumerate(depths) if depth <= max(0, max_depth)]
        index = {node: i for i, node in enumerate(kept)}
        return DraftTree(tokens=[self.tokens[n] for n in kept],
                         parents=[-1] + [index[self.parents[n]] for n in kept[1:]])


@dataclass
class TrieBuilder:
    """Merges token paths below a root into a tree; shared prefixes share
    nodes and distinct continuations become siblings. Stops growing at
    `max_nodes` nodes (root included)."""

    root: int
    max_nodes: int
    tree: DraftTree = field(init=False)
    _children: list[dict[int, int]] = field(init=False)

    def __post_init__(self) -> None:
        self.tree = DraftTree.root_only(self.root)
        self._children = [{}]

    @property
    def full(self) -> bool:
        return len(self.tree) >= self.max_nodes

    def add_path(self, path: Iterable[int]) -> None:
        node = 0
        for token in path:
            child = self._children[node].get(token)
            if child is None:
                if self.full:
                    return
                child = len(self.tree)
                self.tree.tokens.append(token)
                self.tree.parents.append(node)
                self._children.append({})
                self._children[node][token] = child
            node = child
