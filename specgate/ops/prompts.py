"""Benchmark prompts: the built-in mixed set (prompts.json), or a JSONL file of your own.

A JSONL line is `{"messages": [...]}` or `{"prompt": "..."}`, optionally with
`max_tokens`, `temperature` and `domain`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    """Chat, code, math and summarisation; short and long answers (prompts.json in this package)."""
    from importlib import resources

    rows = json.loads(resources.files("specgate.ops").joinpath("prompts.json").read_text(encoding="utf-8"))
    return [prompt_from(row) for row in rows]


def prompt_from(data: dict[str, Any]) -> Prompt:
    return Prompt(messages=tuple(data.get("messages") or ()), prompt=data.get("prompt"),
                  max_tokens=data.get("max_tokens"), temperature=data.get("temperature"),
                  domain=data.get("domain", "chat"))


def load_prompts(path: str | Path) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            prompts.append(prompt_from(data))
        except (ValueError, AttributeError) as exc:
            raise ValueError(f"{path}:{number}: not a prompt object: {exc}") from None
        if not prompts[-1].messages and prompts[-1].prompt is None:
            raise ValueError(f"{path}:{number}: needs 'messages' or 'prompt'")
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
