"""Bundled engine speed: tokens/s with and without speculation, per prompt type.

Greedy decoding of the packaged SmolLM2-135M-Instruct on this CPU, three ways
per prompt: plain, n-gram chain drafts (one match), n-gram tree drafts
(several matches merged); with `--drafter eagle3[:PATH]` a fourth, EAGLE-3
trees from a head (`eagle3` alone: the shipped one), and `--only chat` keeps
the chat prompts. Runs are interleaved per prompt and repeated; the
median time counts, and each speculative output is compared with the plain
one. A prompt type's speed-up is its prompts' plain time over their time.
Acceptance rate = accepted / drafted tokens along the deepest path (vLLM's
counting); mean accepted length = 1 + accepted / steps.

    python bench/engine.py [--repeats 3] [--max-tokens 128] [--drafter eagle3[:PATH]] [--only chat]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from backends.engine.decoding import TreeVerifier
from backends.engine.drafters import make_drafter_factory
from backends.engine.generate import DecodeOptions, Drafter, StepStats, decode
from backends.engine.loading import load_model
from backends.engine.ngram import NgramConfig, NgramDrafter

CODE = """def load_users(path):
    users = []
    with open(path) as handle:
        for line in handle:
            name, email, age = line.strip().split(",")
            users.append({"name": name, "email": email, "age": int(age)})
    return users


def adults(users):
    result = []
    for user in users:
        if user["age"] >= 18:
            result.append(user)
    return result
"""
CLASS = """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count

    def total(self):
        return sum(self.items.values())
"""
ARTICLE = """The city council met on Tuesday to discuss the new river park. The river park will \
run along the east bank of the river, from the old mill to the railway bridge. The council said \
the river park will have walking paths, a playground and a small boat dock. Work on the river park \
will start in March and should end in October. The council will pay for the river park with money \
from the state and from local businesses. Some people at the meeting said the river park is too \
expensive. Others said the river park will bring visitors and help shops on Main Street."""
REPORT = """The public library will change its opening hours from the first of May. The library \
will open at nine in the morning instead of ten, and it will close at eight in the evening on \
weekdays. On Saturdays the library will open from ten to four, and on Sundays the library will stay \
closed. The library said the new hours follow a survey of more than two thousand readers, most of \
whom asked for earlier mornings and later evenings. The children's room will keep its old hours \
until the summer, when the library will hire two more staff."""
PROMPTS = {  # name -> (prompt type, user message)
    "code editing: docstrings": ("code editing", "Add a docstring to each function. Output the complete code."
                                 f"\n\n```python\n{CODE}```"),
    "code editing: type hints": ("code editing", "Add type hints to every method. Output the complete class."
                                 f"\n\n```python\n{CLASS}```"),
    "summarisation: river park": ("summarisation", "Summarise this article in three sentences, reusing its "
                                  f"wording:\n\n{ARTICLE}"),
    "summarisation: library": ("summarisation", f"Summarise this notice in three sentences:\n\n{REPORT}"),
    "chat": ("chat", "Give me three tips for learning to cook at home."),
    "chat: weekend": ("chat", "What could I do on a rainy weekend with two young children?"),
    "chat: sleep": ("chat", "Why is a regular sleep schedule good for you? Explain briefly."),
}
Factory = Callable[[], Drafter] | None
MODES: dict[str, Factory] = {
    "plain": None,
    "chain": lambda: NgramDrafter(NgramConfig(max_matches=1)),
    "tree": lambda: NgramDrafter(NgramConfig()),
}


def run(verifier: TreeVerifier, prompt: list[int], options: DecodeOptions, factory: Factory):
    drafter = factory() if factory else None
    started = time.perf_counter()
    steps = list(decode(verifier, prompt, options, drafter))
    return time.perf_counter() - started, steps


@dataclass
class Measured:
    """One prompt decoded one way: median time over the repeats, last run's steps."""

    seconds: float
    steps: list[StepStats]

    @property
    def output(self) -> list[int]:
        return [token for step in self.steps for token in step.tokens]


def measure(verifier: TreeVerifier, prompt: list[int], options: DecodeOptions, repeats: int,
            modes: dict[str, Factory]) -> dict[str, Measured]:
    """Every mode on one prompt, interleaved round by round."""
    run(verifier, prompt, options, None)  # warm-up
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    steps = {}
    for _ in range(repeats):
        for mode, factory in modes.items():
            elapsed, steps[mode] = run(verifier, prompt, options, factory)
            times[mode].append(elapsed)
    return {mode: Measured(statistics.median(times[mode]), steps[mode]) for mode in modes}


def row(name: str, mode: str, result: Measured, plain: Measured) -> str:
    steps = result.steps
    drafted = sum(s.draft_depth for s in steps)
    accepted = sum(s.accepted for s in steps)
    rate = f"{accepted / drafted:.2f}" if drafted else "-"
    tokens = len(result.output)
    return (f"| {name} | {mode} | {tokens} | {tokens / result.seconds:.1f} | {plain.seconds / result.seconds:.2f}x | "
            f"{rate} | {1 + accepted / len(steps):.2f} | {len(steps)} | "
            f"{'yes' if result.output == plain.output else 'NO'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--drafter", help="also decode with this drafter: eagle3 or eagle3:PATH")
    parser.add_argument("--only", help="keep the prompts of this type (e.g. chat)")
    args = parser.parse_args()
    loaded = load_model("default")
    verifier = TreeVerifier(loaded.model)
    modes = dict(MODES)
    if args.drafter:
        modes[args.drafter.split(":", 1)[0]] = make_drafter_factory(args.drafter, loaded.model)
    prompts = {name: value for name, value in PROMPTS.items() if args.only in (None, value[0])}
    options = DecodeOptions(max_tokens=args.max_tokens, stop_ids=frozenset({loaded.tokenizer.eos_token_id}))
    print(f"torch threads: {torch.get_num_threads()}")
    print("| prompt | mode | tokens | tokens/s | speed-up | acceptance | mean accepted length | steps | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    seconds_by_type: dict[tuple[str, str], float] = defaultdict(float)
    for name, (kind, text) in prompts.items():
        prompt = list(loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                           add_generation_prompt=True, tokenize=True,
                                                           return_dict=False))
        results = measure(verifier, prompt, options, args.repeats, modes)
        for mode, result in results.items():
            print(row(name, mode, result, results["plain"]))
            seconds_by_type[kind, mode] += result.seconds
    drafted = [mode for mode in modes if mode != "plain"]
    print("\n| prompt type | " + " | ".join(f"{mode} speed-up" for mode in drafted) + " |")
    print("|---|" + "---|" * len(drafted))
    for kind in dict.fromkeys(kind for kind, _ in prompts.values()):
        plain = seconds_by_type[kind, "plain"]
        print(f"| {kind} | " + " | ".join(f"{plain / seconds_by_type[kind, m]:.2f}x" for m in drafted) + " |")


if __name__ == "__main__":
    main()
