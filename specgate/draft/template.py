"""A conversation as the target sees it: its chat template, tokenized, with the loss mask.

The mask is 1 on the tokens of every assistant turn (the answer's text and
the end-of-turn token that closes it) and 0 elsewhere: system and user turns,
the template's role headers, the default system prompt a template may add,
and the whitespace after an end-of-turn token. It is found from the rendered
text: the template rendered up to a turn (with the generation prompt) is a
prefix of the whole rendering, so each answer is the character span between
the two, and a token belongs to the answer when it starts inside that span.
"""

from __future__ import annotations

from typing import Any

from backends.chat_template import TemplateError


def answer_spans(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant turn in it."""
    text: str = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before: str = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        through: str = tokenizer.apply_chat_template(messages[:i + 1], tokenize=False)
        if not (text.startswith(through) and through.startswith(before)):
            raise TemplateError(f"the chat template does not render turn {i} as a prefix of the conversation")
        end = len(before) + len(through[len(before):].rstrip())  # trailing whitespace is the template's
        spans.append((len(before), end))
    return text, spans


def tokenize(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """input_ids of the templated conversation and its loss mask (1 on assistant tokens)."""
    text, spans = answer_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = [int(t) for t in encoded["input_ids"]]
    mask = [int(any(start <= begin < end for start, end in spans)) for begin, _ in encoded["offset_mapping"]]
    return ids, mask
