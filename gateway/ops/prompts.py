"""Benchmark prompts: a built-in mixed set, or a JSONL file of your own.

A JSONL line is `{"messages": [...]}` or `{"prompt": "..."}`, optionally with
`max_tokens`, `temperature` and `domain`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CODE = "def parse(line):\n    name, age = line.split(',')\n    return {'name': name, 'age': int(age)}\n"


@dataclass(frozen=True)
class Prompt:
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    domain: str = "chat"
    extra: dict[str, Any] = field(default_factory=dict)

    def body(self, model: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens or max_tokens, "stream": stream,
                                "temperature": 0.0 if self.temperature is None else self.temperature, **self.extra}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.prompt is not None:
            body["prompt"] = self.prompt
        else:
            body["messages"] = list(self.messages)
        return body

    @property
    def path(self) -> str:
        return "/v1/completions" if self.prompt is not None else "/v1/chat/completions"


def user(text: str, **fields: Any) -> Prompt:
    return Prompt(messages=({"role": "user", "content": text},), **fields)


def builtin_prompts() -> list[Prompt]:
    """Chat, code, math and summarisation; short and long answers."""
    return [
        user("Give me three tips for sleeping better.", domain="chat"),
        user("Write a short poem about autumn rain.", domain="chat", max_tokens=64),
        user(f"Add type hints and a docstring to this function, and output the full code:\n```python\n{CODE}```",
             domain="code"),
        user("Write a Python function that checks whether a string is a palindrome.", domain="code"),
        user("Solve for x: 3x + 7 = 22. Show each step.", domain="math"),
        user("What is 17 * 23? Answer with the number only.", domain="math", max_tokens=16),
        user("Summarize in two sentences: The river rose after three days of rain. Farmers moved their "
             "animals to higher ground, and the town opened the school as a shelter.", domain="summarization"),
        user("Explain how a hash map works, in detail, with an example.", domain="chat", max_tokens=512),
    ]


def load_prompts(path: str | Path) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            prompts.append(Prompt(messages=tuple(data.get("messages") or ()), prompt=data.get("prompt"),
                                  max_tokens=data.get("max_tokens"), temperature=data.get("temperature"),
                                  domain=data.get("domain", "chat")))
        except (ValueError, AttributeError) as exc:
            raise ValueError(f"{path}:{number}: not a prompt object: {exc}") from None
        if not prompts[-1].messages and prompts[-1].prompt is None:
            raise ValueError(f"{path}:{number}: needs 'messages' or 'prompt'")
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
