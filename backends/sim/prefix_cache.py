"""A replica's prefix cache, keyed like vLLM's automatic prefix caching.

vLLM V1 splits a prompt into blocks of 16 tokens and names each full block by
a hash of its tokens chained with its parent block's hash, so a block is found
only after the same prefix (`vllm/v1/core/kv_cache_utils.py`). A new request
reuses the longest run of cached blocks from its start and computes the rest;
at least its last token is always computed. Freed blocks stay cached until
memory is needed and are evicted least recently used first, a chain's tail
before its head (a freed request returns its blocks tail first).

The simulator has no tokenizer: a token is four characters, as in
`backends.serving.generation.estimate_tokens`, so a block is 64 characters.
Hits and queries count tokens, as vLLM's `vllm:prefix_cache_hits_total` and
`vllm:prefix_cache_queries_total` do.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

CHARS_PER_TOKEN = 4
BLOCK_TOKENS = 16  # vLLM's default --block-size on GPUs


@dataclass(frozen=True)
class Lookup:
    """What one prompt found: its tokens, the cached ones, and its block hashes."""

    prompt_tokens: int
    cached_tokens: int
    blocks: tuple[bytes, ...]

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def block_hashes(text: str, block_tokens: int = BLOCK_TOKENS) -> tuple[bytes, ...]:
    """The chained hashes of `text`'s full blocks, in order."""
    size = block_tokens * CHARS_PER_TOKEN
    hashes: list[bytes] = []
    parent = b""
    for start in range(0, len(text) - size + 1, size):
        parent = hashlib.blake2b(parent + text[start : start + size].encode(), digest_size=16).digest()
        hashes.append(parent)
    return tuple(hashes)


class PrefixCache:
    """At most `capacity_blocks` cached blocks, evicted least recently used."""

    def __init__(self, capacity_blocks: int, block_tokens: int = BLOCK_TOKENS) -> None:
        if capacity_blocks < 1:
            raise ValueError("a prefix cache holds at least one block")
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[bytes, None] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, text: str, prompt_tokens: int) -> Lookup:
        """How many of the prompt's leading tokens are cached; changes nothing."""
        blocks = block_hashes(text, self.block_tokens)
        matched = 0
        for block in blocks:
            if block not in self._blocks:
                break
            matched += 1
        cached = min(matched * self.block_tokens, max(0, prompt_tokens - 1))
        return Lookup(prompt_tokens, cached, blocks)

    def store(self, blocks: tuple[bytes, ...]) -> None:
        """Cache `blocks` (a prefix chain) as just used, the head the most recent,
        evicting the least recently used blocks past the capacity."""
        for block in reversed(blocks):
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
