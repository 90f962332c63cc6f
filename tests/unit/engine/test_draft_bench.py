"""The draft bench's counting: acceptance per position and the prompt selection,
on the held-out prompt file it reads by default."""

from __future__ import annotations

from pathlib import Path

from backends.engine.generate import StepStats
from bench.draft_engine import Totals, read_prompts
from bench.engine import Measured

HELDOUT = Path(__file__).resolve().parents[3] / "data" / "draft" / "heldout.jsonl"


def test_per_position_counts_the_drafts_whose_first_k_tokens_were_accepted():
    totals = Totals()
    steps = [StepStats([1, 2, 3], draft_depth=4, accepted=2), StepStats([4], draft_depth=3, accepted=0),
             StepStats([5]), StepStats([6, 7, 8, 9], draft_depth=3, accepted=3)]
    totals.add(Measured(2.0, steps))
    assert (totals.tokens, totals.steps, totals.drafts, totals.drafted, totals.accepted) == (9, 4, 3, 10, 5)
    assert totals.per_position == [2, 2, 1]  # a step without a draft is not a draft
    totals.add(Measured(1.0, [StepStats([1, 2], draft_depth=1, accepted=1)]))
    assert totals.per_position == [3, 2, 1] and totals.seconds == 3.0


def test_prompts_are_kept_per_type_in_file_order():
    everything = read_prompts(HELDOUT, None)
    assert len(everything) == 42
    assert sorted({kind for kind, _ in everything}) == ["chat", "code", "summarization"]
    few = read_prompts(HELDOUT, 2)
    assert [kind for kind, _ in few].count("chat") == 2 and len(few) == 6
    assert few[0] == everything[0] and all(messages[-1]["role"] == "user" for _, messages in few)
