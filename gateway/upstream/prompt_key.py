"""`PromptKey`: what a pool's balancer reads of a request to keep its prompt
where the backend's prefix cache holds it.

The prompt is hashed in leading blocks, each hash covering everything before
it (a chain): chat messages turn by turn, each message's role and content
in blocks of `block_chars` characters, so the hashes of a conversation's
next turn begin with the hashes of its previous one. A completion prompt is
hashed as blocks of its text (token ids: blocks of `block_chars / 4` ids).

The chain uses Python's own hash (64 bits, a few hundred nanoseconds a
block): it differs between processes, and so does each process's prefix map.
What gateways must agree on without sharing state, where a prompt never seen
goes, is hashed with BLAKE2b instead: the prompt's first block (the
`anchor`) and the session key.

Nothing is hashed until a pool that balances by prefix asks, and then once
per block size. Only the first `MAX_PREFIX_CHARS` of a prompt are hashed: past
any context a backend caches, and an 8 MB prompt would otherwise cost ~50 ms
of hashing on the event loop and 31,000 entries of a pool's prefix map,
evicting every other client's prefixes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.decide import apis

TOKEN_CHARS = 4  # characters a token id stands for when token prompts are cut into blocks
MAX_PREFIX_CHARS = 1 << 20  # ~256K tokens: a prompt's text past this is not hashed


@dataclass(frozen=True, slots=True)
class Blocks:
    hashes: tuple[int, ...]  # one per block, each over the whole prompt up to the block's end
    anchor: int | None  # the first block, hashed the same in every process; None for an empty prompt


class PromptKey:
    """A request's prompt (the parsed body, already validated by the features)
    and where its session key may be: a header, or the body's `user`. Built per
    request: a plain class, whose `__init__` mypyc compiles."""

    def __init__(self, body: Mapping[str, Any], endpoint: str, headers: Mapping[str, str] | None = None) -> None:
        self.body = body
        self.endpoint = endpoint  # "chat", "completions", "messages" or "responses"
        self.headers: Mapping[str, str] = {} if headers is None else headers
        self._blocks: dict[int, Blocks] = {}

    def blocks(self, block_chars: int) -> Blocks:
        """The prompt's leading blocks, hashed once per block size."""
        found = self._blocks.get(block_chars)
        if found is None:
            if self.endpoint == "completions":
                found = completion_blocks(self.body.get("prompt"), block_chars)
            elif self.endpoint == "chat":
                found = chat_blocks(self.body.get("messages"), block_chars)
            else:  # Messages and Responses: their turns read as chat messages
                found = chat_blocks(apis.conversation(self.endpoint, self.body), block_chars)
            self._blocks[block_chars] = found
        return found

    def session(self, header: str) -> int | None:
        """The hash of the session key: the header's value, else the body's (`user`;
        `metadata.user_id` in Messages); None without one."""
        value = self.headers.get(header.lower()) or apis.session_of(self.endpoint, self.body)
        return None if value is None else digest(value.encode())


def digest(data: bytes) -> int:
    """64 bits of BLAKE2b: the same in every process."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def chat_blocks(messages: Any, block_chars: int) -> Blocks:
    """Each message's role, then its content cut in blocks (an empty content is
    one empty block). The role marks a message's first block, so a message
    boundary never hashes like a block boundary inside one message."""
    running, first, budget = 0, None, MAX_PREFIX_CHARS
    hashes: list[int] = []
    append = hashes.append
    for message in messages if isinstance(messages, list) else ():
        if budget <= 0:
            break
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        role = role if isinstance(role, str) else ""
        text = _content(message.get("content"))[:budget]
        budget -= max(1, len(text))
        if first is None:
            first = f"{role}\x1f{text[:block_chars]}"
        running = hash((running, role, text[:block_chars]))
        append(running)
        for start in range(block_chars, len(text), block_chars):  # a long message's further blocks
            running = hash((running, None, text[start:start + block_chars]))
            append(running)
    return Blocks(tuple(hashes), None if first is None else digest(first.encode()))


def completion_blocks(prompt: Any, block_chars: int) -> Blocks:
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompt = "\n".join(prompt)
    if isinstance(prompt, str):
        prompt = prompt[:MAX_PREFIX_CHARS]
        pieces: list[Any] = [prompt[start:start + block_chars] for start in range(0, len(prompt), block_chars)]
        first = pieces[0].encode() if pieces else None
    elif isinstance(prompt, list) and prompt:
        ids = prompt if isinstance(prompt[0], int) else [t for row in prompt if isinstance(row, list) for t in row]
        ids = ids[:MAX_PREFIX_CHARS // TOKEN_CHARS]
        step = max(1, block_chars // TOKEN_CHARS)
        pieces = [tuple(ids[start:start + step]) for start in range(0, len(ids), step)]
        first = ",".join(map(str, pieces[0])).encode() if pieces else None
    else:
        return Blocks((), None)
    running = 0
    hashes: list[int] = []
    for piece in pieces:
        running = hash((running, piece))
        hashes.append(running)
    return Blocks(tuple(hashes), None if first is None else digest(first))


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""
