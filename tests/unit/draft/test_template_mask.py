"""The chat template and the loss mask, on the packaged SmolLM2 tokenizer's real output."""

from __future__ import annotations

import copy
import os

import pytest

from backends.chat_template import TemplateError, end_of_turn, opening, stop_tokens
from specgate.draft.template import tokenize

pytestmark = pytest.mark.slow  # transformers and the packaged model's tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    from backends.model import prepare

    return AutoTokenizer.from_pretrained(prepare())


def masked_text(tokenizer, ids, mask) -> list[str]:
    """The decoded runs of masked tokens, in order."""
    runs, current = [], []
    for token, bit in zip(ids, mask, strict=True):
        if bit:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_ids_are_the_templates_own_tokenization(tokenizer):
    messages = [{"role": "user", "content": "Name three colours."},
                {"role": "assistant", "content": "Red, green, blue."}]
    ids, mask = tokenize(tokenizer, messages)
    assert ids == list(tokenizer.apply_chat_template(messages, tokenize=True)["input_ids"])
    assert len(mask) == len(ids)


def test_only_the_answer_and_its_end_of_turn_are_masked_in(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "Paris."}]
    ids, mask = tokenize(tokenizer, messages)
    assert masked_text(tokenizer, ids, mask) == ["Paris.<|im_end|>"]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    # the system and user turns, the role headers and the newline after the answer's end are out
    assert mask[-1] == 0 and ids[-2] == end and mask[-2] == 1
    assert all(bit == 0 for token, bit in zip(ids, mask, strict=True) if token == start)
    assert sum(mask) == len(tokenizer("Paris.", add_special_tokens=False)["input_ids"]) + 1


def test_every_assistant_turn_of_a_multi_turn_conversation_is_masked_in(tokenizer):
    messages = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello, how can I help?"},
                {"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "2 + 2 = 4."},
                {"role": "user", "content": "And times 3?"}, {"role": "assistant", "content": "12."}]
    ids, mask = tokenize(tokenizer, messages)
    assert masked_text(tokenizer, ids, mask) == ["Hello, how can I help?<|im_end|>", "2 + 2 = 4.<|im_end|>",
                                                 "12.<|im_end|>"]
    text = tokenizer.decode([t for t, bit in zip(ids, mask, strict=True) if not bit])
    assert "SmolLM" in text  # the template's default system prompt is there, and out of the loss
    for user in ("Hi!", "What is 2 + 2?", "And times 3?"):
        assert user in text


def test_a_template_that_does_not_grow_by_prefixes_is_refused():
    class Shuffling:
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            return "|".join(m["content"] for m in reversed(messages)) + ("|" if add_generation_prompt else "")

    with pytest.raises(TemplateError):
        tokenize(Shuffling(), [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])


def test_end_of_turn_comes_from_the_template_even_when_eos_names_another_token(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn(tokenizer) == end_of_turn(tokenizer, "user") == im_end
    converted = copy.deepcopy(tokenizer)  # a GGUF conversion that names <|endoftext|> as eos
    converted.eos_token = "<|endoftext|>"
    assert converted.eos_token_id != im_end and end_of_turn(converted) == im_end
    assert stop_tokens(tokenizer) == {im_end}
    assert stop_tokens(converted) == {im_end, converted.eos_token_id}


def test_without_a_chat_template_an_answer_stops_at_eos_alone():
    class Plain:
        eos_token_id = 2

        def apply_chat_template(self, messages, tokenize=False):
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")

    assert stop_tokens(Plain()) == {2}


def test_the_magpie_opening_is_what_the_template_writes_before_a_users_text(tokenizer):
    start = opening(tokenizer)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False)
    assert rendered.startswith(tokenizer.decode(start)) and tokenizer.decode(start).endswith("user\n")
    assert rendered[len(tokenizer.decode(start)):].startswith("Hi there")
