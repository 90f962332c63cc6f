"""Bundled engine speed: tokens/s with and without speculation, per prompt type.

Greedy decoding of the packaged SmolLM2-135M-Instruct on this CPU, three ways
per prompt: plain, n-gram chain drafts (one match), n-gram tree drafts
(several matches merged). Runs are interleaved per prompt and repeated; the
median time counts. Acceptance rate = accepted / drafted tokens along the
deepest path (vLLM's counting); mean accepted length = 1 + accepted / steps.

    python bench/engine.py [--repeats 3] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from backends.engine.decoding import TreeVerifier
from backends.engine.generate import DecodeOptions, decode
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
ARTICLE = """The city council met on Tuesday to discuss the new river park. The river park will \
run along the east bank of the river, from the old mill to the railway bridge. The council said \
the river park will have walking paths, a playground and a small boat dock. Work on the river park \
will start in March and should end in October. The council will pay for the river park with money \
from the state and from local businesses. Some people at the meeting said the river park is too \
expensive. Others said the river park will bring visitors and help shops on Main Street."""
PROMPTS = {
    "code editing": f"Add a docstring to each function. Output the complete code.\n\n```python\n{CODE}```",
    "summarisation": f"Summarise this article in three sentences, reusing its wording:\n\n{ARTICLE}",
    "chat": "Give me three tips for learning to cook at home.",
}
MODES = {
    "plain": None,
    "chain": NgramConfig(max_matches=1),
    "tree": NgramConfig(),
}


def run(verifier: TreeVerifier, prompt: list[int], options: DecodeOptions, config: NgramConfig | None):
    drafter = NgramDrafter(config) if config else None
    started = time.perf_counter()
    steps = list(decode(verifier, prompt, options, drafter))
    elapsed = time.perf_counter() - started
    tokens = sum(len(s.tokens) for s in steps)
    return tokens, elapsed, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    loaded = load_model("default")
    verifier = TreeVerifier(loaded.model)
    options = DecodeOptions(max_tokens=args.max_tokens, stop_ids=frozenset({loaded.tokenizer.eos_token_id}))
    print(f"torch threads: {torch.get_num_threads()}")
    print("| prompt | mode | tokens | tokens/s | speed-up | acceptance | mean accepted length | steps |")
    print("|---|---|---|---|---|---|---|---|")
    for name, text in PROMPTS.items():
        prompt = list(loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                           add_generation_prompt=True, tokenize=True,
                                                           return_dict=False))
        run(verifier, prompt, options, None)  # warm-up
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        stats = {}
        for _ in range(args.repeats):
            for mode, config in MODES.items():
                tokens, elapsed, steps = run(verifier, prompt, options, config)
                times[mode].append(elapsed)
                stats[mode] = (tokens, steps)
        base = statistics.median(times["plain"])
        for mode in MODES:
            tokens, steps = stats[mode]
            elapsed = statistics.median(times[mode])
            drafted = sum(s.draft_depth for s in steps)
            accepted = sum(s.accepted for s in steps)
            rate = f"{accepted / drafted:.2f}" if drafted else "-"
            print(f"| {name} | {mode} | {tokens} | {tokens / elapsed:.1f} | {base / elapsed:.2f}x | {rate} | "
                  f"{1 + accepted / len(steps):.2f} | {len(steps)} |")


if __name__ == "__main__":
    main()
