"""What flows between the HTTP layer and a token generator.

The app parses a request into a `GenerationRequest`, hands it to a
`TokenGenerator`, and turns the `Delta`s it yields into vLLM-shaped JSON or SSE.
The generator owns tokens and timing only; everything on the wire is the app's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Endpoint = Literal["chat", "completions"]


@dataclass(frozen=True)
class GenerationRequest:
    """A validated chat or completions request.

    `messages` is set for chat requests, `prompt` for completions. Sampling
    fields keep `None` when the client omitted them, so a generator can apply
    its own defaults. `mark_running` is called by a generator that queues
    requests, at the moment the request joins a batch; if it never calls it,
    the app counts the request as running from its first `Delta`.
    """

    endpoint: Endpoint
    request_id: str
    model: str
    messages: tuple[dict[str, Any], ...] | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    body: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    mark_running: Callable[[], None] = field(
        default=lambda: None, repr=False, compare=False
    )

    def prompt_text(self) -> str:
        """The prompt as plain text: the completions prompt, or the chat
        messages' text contents joined by newlines."""
        if self.prompt is not None:
            return self.prompt
        parts: list[str] = []
        for message in self.messages or ():
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    str(item.get("text", ""))
                    for item in content
                    if isinstance(item, dict) and item.get("type") == "text"
                )
        return "\n".join(parts)


@dataclass(frozen=True)
class Delta:
    """A piece of generated text.

    `tokens` is how many tokens the piece holds (a speculative step can emit
    several at once). `finish_reason` ("stop", "length", ...) marks the last
    piece. A generator that knows the real prompt length reports it in
    `prompt_tokens` on any piece; otherwise the app estimates it. A piece
    from a speculative verify step says how many tokens were `drafted` and
    how many of them `accepted` (0 drafted: not a verify step).
    """

    text: str
    tokens: int = 1
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    drafted: int = 0
    accepted: int = 0


class TokenGenerator(Protocol):
    """Anything that turns a request into a stream of `Delta`s.

    Cancellation (the client went away) arrives as `asyncio.CancelledError`
    at the generator's current `await`, then the generator is closed.
    """

    def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]: ...


def estimate_tokens(text: str) -> int:
    """A tokenizer-free token count: about four characters per token, the
    usual rule of thumb for English BPE vocabularies."""
    return max(1, (len(text) + 3) // 4)
