"""Speculative greedy decoding emits exactly the tokens plain greedy decoding does."""

import pytest

from backends.engine.decoding import Sampling, TreeVerifier
from backends.engine.ngram import NgramConfig, NgramDrafter
from backends.engine.sequence import TokenLoop

PROMPTS = {
    "code": "Rename the variable x to count everywhere in this code and show the result:\n"
    "```python\ndef total(items):\n    x = 0\n    for item in items:\n"
    "        x += item.price * item.quantity\n    return x\n```",
    "summary": "Summarise this paragraph in one sentence: The city council met on Tuesday "
    "to discuss the new bus routes. The council agreed that the new bus routes will "
    "start in May, and that the old bus routes will stop in June.",
    "chat": "Tell me three facts about the Moon.",
}


def chat_ids(tokenizer, text):
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(rendered, add_special_tokens=False).input_ids


@pytest.mark.parametrize("kind", sorted(PROMPTS))
def test_tree_speculation_matches_plain_greedy(smollm, kind):
    verifier = TreeVerifier(smollm.model)
    prompt = chat_ids(smollm.tokenizer, PROMPTS[kind])
    plain = TokenLoop(verifier, prompt, max_tokens=128).run()
    loop = TokenLoop(verifier, prompt, max_tokens=128, drafter=NgramDrafter(NgramConfig()))
    accepted = 0
    while loop.finish_reason is None:
        loop.step()
        accepted += loop.last_step.accepted
    assert len(plain) == 128
    assert loop.output == plain
    assert loop.finish_reason == "length"
    if kind == "code":
        assert accepted > 0  # the answer repeats the prompt's code: drafts must land


def test_stop_token_ends_output_and_is_kept(smollm):
    verifier = TreeVerifier(smollm.model)
    prompt = chat_ids(smollm.tokenizer, "What is the capital of France?")
    eos = smollm.tokenizer.eos_token_id
    loop = TokenLoop(verifier, prompt, max_tokens=64, drafter=NgramDrafter(), stop_ids={eos})
    out = loop.run()
    assert loop.finish_reason == "stop"
    assert out[-1] == eos and eos not in out[:-1]
    assert "Paris" in smollm.tokenizer.decode(out)


def test_seeded_sampling_is_repeatable_and_tree_safe(smollm):
    verifier = TreeVerifier(smollm.model)
    prompt = chat_ids(smollm.tokenizer, PROMPTS["code"])

    def sample(seed):
        sampling = Sampling.create(0.8, 0, 1.0, seed)
        return TokenLoop(verifier, prompt, max_tokens=24, sampling=sampling, drafter=NgramDrafter()).run()

    first = sample(7)
    assert len(first) == 24
    assert sample(7) == first
