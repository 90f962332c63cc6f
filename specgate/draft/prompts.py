"""Prompt files: read, normalise, filter and deduplicate conversations.

A prompts JSONL has one conversation a line: `{"messages": [{"role", "content"},
...], "class": "chat/mid"}` (class optional), or `{"prompt": "text"}` for a
single user turn. The capture files the gateway writes have this shape too.
A prompt's id is the hash of its normalised messages, so the same prompt
gets the same id in every file and on every run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Prompt:
    messages: tuple[tuple[str, str], ...]  # (role, content); the last one is the user's
    traffic_class: str | None = None
    id: str = field(default="", compare=False)
    source: str | None = field(default=None, compare=False)  # the generator or file it came from

    def __post_init__(self) -> None:
        if not self.id:
            digest = hashlib.sha256(json.dumps(self.messages).encode("utf-8")).hexdigest()[:16]
            object.__setattr__(self, "id", digest)

    def as_messages(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "class": self.traffic_class, "source": self.source, "messages": self.as_messages()}


def parse(data: Any) -> Prompt | None:
    """A prompt from one JSON line; None when it holds no usable conversation."""
    if not isinstance(data, dict):
        return None
    raw = data.get("messages")
    if raw is None and isinstance(data.get("prompt"), str):
        raw = [{"role": "user", "content": data["prompt"]}]
    if not isinstance(raw, list):
        return None
    messages = []
    for message in raw:
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return None
        content = message.get("content")
        if not isinstance(content, str):
            return None
        messages.append((message["role"], content.strip()))
    if not messages or messages[-1][0] != "user" or not all(text for _, text in messages):
        return None
    traffic_class, source = data.get("class"), data.get("source")
    return Prompt(tuple(messages), traffic_class if isinstance(traffic_class, str) else None,
                  source=source if isinstance(source, str) else None)


def read(paths: Iterable[Path]) -> Iterator[Prompt | None]:
    """Every line of the files, parsed (None for a line that is not a usable prompt)."""
    for path in paths:
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if not line.strip():
                    continue
                try:
                    yield parse(json.loads(line))
                except json.JSONDecodeError:
                    yield None


@dataclass
class Selection:
    kept: list[Prompt] = field(default_factory=list)
    duplicates: int = 0
    unusable: int = 0
    filtered: int = 0


def select(prompts: Iterable[Prompt | None], classes: frozenset[str] = frozenset(),
           max_chars: int | None = None, limit: int | None = None) -> Selection:
    """Deduplicated prompts, in first-seen order, of the given classes (any when
    empty) and at most `max_chars` of text, up to `limit` of them."""
    out = Selection()
    seen: set[str] = set()
    for prompt in prompts:
        if prompt is None:
            out.unusable += 1
        elif prompt.id in seen:
            out.duplicates += 1
        elif (classes and prompt.traffic_class not in classes) or (
                max_chars is not None and sum(len(text) for _, text in prompt.messages) > max_chars):
            out.filtered += 1
        elif limit is None or len(out.kept) < limit:
            seen.add(prompt.id)
            out.kept.append(prompt)
    return out


def write(path: Path, prompts: Iterable[Prompt]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for prompt in prompts:
            out.write(json.dumps(prompt.to_json(), ensure_ascii=False) + "\n")
            count += 1
    return count
