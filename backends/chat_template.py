"""What a model's chat template writes around a turn's words: the tokens
before a first user turn, the token after a turn, and so where generation ends.

Read from the template itself, by rendering a turn whose words are a marker no
template writes. A tokenizer's `eos_token` is not enough: a GGUF conversion
may name another token (one transformers release named `<|endoftext|>` for a
model whose turns end with `<|im_end|>`), and a server that stops only at it
runs past the end of a turn into turns the model invents.
"""

from __future__ import annotations

from typing import Any

MARK = "\u2063specgate-turn\u2063"  # a text no template writes: stands for a turn's words


class TemplateError(ValueError):
    """The chat template does not render turns the way this module reads them."""


def _around(tokenizer: Any, messages: list[dict[str, str]], role: str) -> tuple[str, str]:
    """The rendered text before and after the marked words of the last turn."""
    text: str = tokenizer.apply_chat_template(messages, tokenize=False)
    if MARK not in text:
        raise TemplateError(f"the chat template does not write a {role} turn's text as given")
    at = text.index(MARK)
    return text[:at], text[at + len(MARK):]


def opening(tokenizer: Any) -> list[int]:
    """The token ids the chat template writes before a first user turn's text
    (its default system turn, if it has one, included)."""
    before, _ = _around(tokenizer, [{"role": "user", "content": MARK}], "user")
    return list(tokenizer(before, add_special_tokens=False)["input_ids"])


def end_of_turn(tokenizer: Any, role: str = "assistant") -> int:
    """The token the chat template writes right after the text of a `role` turn:
    where a sampled turn of that role stops."""
    messages = [{"role": "user", "content": "hello"}] if role == "assistant" else []
    _, after = _around(tokenizer, [*messages, {"role": role, "content": MARK}], role)
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    if not ids:
        raise TemplateError(f"the chat template writes nothing after a {role} turn's text")
    return int(ids[0])


def stop_tokens(tokenizer: Any) -> frozenset[int]:
    """Where an answer ends: the tokenizer's `eos_token` and the token the chat
    template writes after an assistant turn (one token where the two agree; the
    eos alone where there is no usable template)."""
    stops = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    try:
        stops.add(end_of_turn(tokenizer))
    except ValueError:  # no chat template (transformers raises ValueError), or one this module cannot read
        pass
    return frozenset(stops)
