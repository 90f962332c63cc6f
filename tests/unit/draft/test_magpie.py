"""Prompts the target writes itself: which sampled turns are kept, and their class."""

from __future__ import annotations

import pytest
import torch

from specgate.draft import magpie
from specgate.draft.ship import answer_batch

END, OPEN = 2, [1, 7, 8]


class Tokenizer:
    """Token t decodes to the word "word<t>"; the template writes OPEN before a user's text, END after it."""

    all_special_tokens = ["<|im_start|>", "<|im_end|>"]

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": OPEN if text == "<|im_start|>user\n" else [END, 9]}

    def decode(self, ids, skip_special_tokens=False):
        return " ".join("<|im_start|>" if t == 1 else f"word{t}" for t in ids)


class Model:
    """generate() hands back the prompt and the next of the rows given, in order; as
    transformers does, a row that ended is padded with the end token, the padding token here."""

    device = "cpu"

    def __init__(self, rows):
        self.rows, self.calls = list(rows), []

    def generate(self, input_ids, attention_mask, **kwargs):
        self.calls.append(kwargs)
        out = [self.rows.pop(0) for _ in range(len(input_ids))]
        width = max(len(r) for r in out)
        prompts = input_ids.tolist()
        return torch.tensor([p + r + [END] * (width - len(r)) for p, r in zip(prompts, out, strict=True)])


def test_kept_turns_ended_distinct_long_enough_and_free_of_template_markers() -> None:
    rows = [[10, 11, 12, 13, END], [10, 11, 12, 13, END],  # a repeat
            [20, 21, 22, 23, 24, 25, 26, 27],  # never ended
            [30, END],  # too short
            [40, 1, 41, 42, 43, END],  # writes a template marker
            [50, 51, 52, 53, END, 60, 61, END], [70, 71, 72, 73, END, END, END, END]]
    model = Model(rows + [[80, 81, 82, 83, END]] * 7)
    got = list(magpie.sample(model, Tokenizer(), count=3, batch_size=7, progress=False))
    assert got == ["word10 word11 word12 word13", "word50 word51 word52 word53", "word70 word71 word72 word73"]
    assert model.calls[0]["eos_token_id"] == END and model.calls[0]["do_sample"] is True


def test_a_turn_another_file_holds_is_not_written_again(tmp_path) -> None:
    earlier = tmp_path / "earlier.jsonl"
    earlier.write_text('{"messages": [{"role": "user", "content": "Word10  WORD11 word12 word13"}]}\n\n'
                       '{not json\n[]\n{"messages": "no list"}\n')
    model = Model([[10, 11, 12, 13, END], [50, 51, 52, 53, END]])
    got = list(magpie.sample(model, Tokenizer(), count=1, batch_size=2, progress=False,
                             exclude=magpie.known_turns([earlier])))  # fmt: skip
    assert got == ["word50 word51 word52 word53"]


def test_sampling_gives_up_after_four_times_the_draws_asked_for() -> None:
    model = Model([[20, 21, 22, 23, 24]] * 16)
    assert list(magpie.sample(model, Tokenizer(), count=2, batch_size=2, progress=False)) == []
    assert len(model.calls) == 4


def test_a_greedy_answer_stops_at_the_templates_end_of_turn() -> None:
    model = Model([[5, 6, END, 9, 9], [7, 8, 9, 9, 9]])
    assert answer_batch(model, [[1, 2], [3]], max_new_tokens=5, end=END) == [[5, 6, END], [7, 8, 9, 9, 9]]
    assert model.calls[0]["eos_token_id"] == END and model.calls[0]["do_sample"] is False


@pytest.mark.parametrize(("text", "kind"), [("Write a Python function that reverses a list.", "code/greedy"),
                                            ("Calculate 17 * 23 for me.", "math/greedy"),
                                            ("Please summarize this article about bees.", "summarization/greedy"),
                                            ("What should I cook for dinner tonight?", "chat/greedy")])
def test_a_turn_gets_a_coarse_class_by_its_words(text: str, kind: str) -> None:
    assert magpie.traffic_class(text) == kind
