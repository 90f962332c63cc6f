"""`PromptKey`: what a pool's balancer reads of a request to keep its prompt
where the backend's prefix cache holds it.

The prompt is hashed in leading blocks, each hash covering everything before
it (a chain): chat messages turn by turn, each message's role and content
in blocks of `block_chars` characters, so the hashes of a conversation's
next turn begin with the hashes of its previous one. A completion prompt is
hashed as blocks of its text (token ids: blocks of `block_chars / 4` ids).
The hash is BLAKE2b, 64 bits: the same text hashes the same in every
process, so gateways and workers that share no state still agree on where a
prefix with no history goes.

Nothing is hashed until a pool that balances by prefix asks, and then once
per block size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

TOKEN_CHARS = 4  # characters a token id stands for when token prompts are cut into blocks
_END = b"\x1e"  # after each message: "ab" + "c" never hashes as "a" + "bc"
_ROLE = b"\x1f"


@dataclass(slots=True, eq=False)
class PromptKey:
    """A request's prompt (the parsed body, already validated by the features)
    and where its session key may be: a header, or the body's `user`."""
    body: Mapping[str, Any]
    endpoint: str  # "chat" or "completions"
    headers: Mapping[str, str] = field(default_factory=dict)
    _blocks: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def blocks(self, block_chars: int) -> tuple[int, ...]:
        """The chained hashes of the prompt's leading blocks, computed once per block size."""
        found = self._blocks.get(block_chars)
        if found is None:
            found = self._blocks[block_chars] = chain(self._pieces(block_chars))
        return found

    def session(self, header: str) -> int | None:
        """The hash of the session key: the header's value, else the body's `user`; None without one."""
        value = self.headers.get(header.lower())
        if not value:
            user = self.body.get("user")
            value = user if isinstance(user, str) and user else None
        return None if value is None else digest(value.encode())

    def _pieces(self, block_chars: int) -> Iterator[tuple[bytes, bool]]:
        if self.endpoint == "chat":
            return chat_pieces(self.body.get("messages"), block_chars)
        return completion_pieces(self.body.get("prompt"), block_chars)


def digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def chain(pieces: Iterator[tuple[bytes, bool]]) -> tuple[int, ...]:
    """One hash per block, each over every byte before its block's end. A
    piece is (bytes, ends_block): pieces that do not end a block only feed
    the hash (a role, a separator)."""
    running = hashlib.blake2b(digest_size=8)
    hashes: list[int] = []
    for data, ends_block in pieces:
        running.update(data)
        if ends_block:
            hashes.append(int.from_bytes(running.copy().digest(), "little"))
    return tuple(hashes)


def chat_pieces(messages: Any, block_chars: int) -> Iterator[tuple[bytes, bool]]:
    """Each message: its role, then its content cut in blocks; an empty content is one empty block."""
    if not isinstance(messages, list):
        return
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        yield (role.encode() if isinstance(role, str) else b"") + _ROLE, False
        yield from _text_blocks(_content(message.get("content")), block_chars)
        yield _END, False


def completion_pieces(prompt: Any, block_chars: int) -> Iterator[tuple[bytes, bool]]:
    if isinstance(prompt, str):
        yield from _text_blocks(prompt, block_chars)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        yield from _text_blocks("\n".join(prompt), block_chars)
    elif isinstance(prompt, list) and prompt:
        ids = prompt if isinstance(prompt[0], int) else [t for row in prompt if isinstance(row, list) for t in row]
        step = max(1, block_chars // TOKEN_CHARS)
        for start in range(0, len(ids), step):
            yield ",".join(map(str, ids[start:start + step])).encode() + b",", True


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _text_blocks(text: str, block_chars: int) -> Iterator[tuple[bytes, bool]]:
    if not text:
        yield b"", True
        return
    for start in range(0, len(text), block_chars):
        yield text[start:start + block_chars].encode(), True
