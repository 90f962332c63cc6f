"""Bundled engine with an EAGLE-3 head: plain vs n-gram vs eagle3 on prompt files.

Decodes each prompt of a draft prompts JSONL (default: the held-out
`data/draft/heldout.jsonl`) with the packaged SmolLM2-135M-Instruct three
ways, interleaved per prompt (the arms alternate, their order rotating from
prompt to prompt): plain decoding, n-gram prompt-lookup trees (the engine's
default drafter) and EAGLE-3 trees from a head (`--drafter eagle3`, the
shipped one, or `eagle3:PATH`). Per prompt class (chat, summarization,
code) and temperature: tokens/s (total tokens over total time), speed-up
over plain, the same by this process's CPU time (on a shared machine the wall
clock also counts the time other work held the core), acceptance per position (the share of drafts whose first k
tokens were accepted, vLLM's per-position counter over its draft counter),
acceptance rate (accepted / drafted tokens along the deepest path) and mean
accepted length (tokens per step). At temperature 0 every arm's output must
equal plain decoding's, token for token (asserted). Sampled runs use the
same seed in every arm.

    python -m bench.draft_engine [--prompts data/draft/heldout.jsonl] [--temperatures 0,0.7]
        [--max-tokens 64] [--per-class N] [--tree top_k,max_depth,max_nodes,min_prob ...]

`--tree` adds one EAGLE-3 arm per shape (for tuning; use training prompts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from backends.engine.decoding import Sampling, TreeVerifier
from backends.engine.drafters import make_drafter_factory, shipped_head
from backends.engine.eagle3.drafter import Eagle3Model
from backends.engine.eagle3.expansion import TreeShape
from backends.engine.generate import DecodeOptions
from backends.engine.loading import load_model
from bench.engine import Factory, Measured, run


@dataclass
class Totals:
    """One arm's runs of one prompt class at one temperature."""

    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time: less at the mercy of other load than the wall clock
    tokens: int = 0
    steps: int = 0
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)

    def add(self, result: Measured, cpu_seconds: float = 0.0) -> None:
        self.seconds += result.seconds
        self.cpu_seconds += cpu_seconds
        self.tokens += len(result.output)
        self.steps += len(result.steps)
        for step in result.steps:
            if step.draft_depth:
                self.drafts += 1
                self.drafted += step.draft_depth
                self.accepted += step.accepted
                self.per_position += [0] * (step.accepted - len(self.per_position))
                for k in range(step.accepted):
                    self.per_position[k] += 1


def read_prompts(path: Path, per_class: int | None) -> list[tuple[str, list[dict[str, str]]]]:
    """(prompt type, messages) of each line; with `per_class`, the first so many of each type."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept: dict[str, int] = defaultdict(int)
    prompts = []
    for row in rows:
        kind = row["class"].split("/")[0]
        kept[kind] += 1
        if per_class is None or kept[kind] <= per_class:
            prompts.append((kind, row["messages"]))
    return prompts


def arms(spec: str, target: object, shapes: list[str]) -> dict[str, Factory]:
    modes: dict[str, Factory] = {"plain": None, "ngram": make_drafter_factory("ngram")}
    if not shapes:
        modes["eagle3"] = make_drafter_factory(spec, target)
        return modes
    path = Path(spec.removeprefix("eagle3:")) if spec != "eagle3" else shipped_head()
    for text in shapes:
        k, depth, nodes, prob = text.split(",")
        shape = TreeShape(int(k), int(depth), int(nodes), float(prob))
        modes[f"eagle3 {text}"] = Eagle3Model.load(path, target, shape).drafter
    return modes


def decode_once(verifier: TreeVerifier, prompt: list[int], options: DecodeOptions, temperature: float,
                seed: int, factory: Factory) -> tuple[Measured, float]:
    """One decode: its wall time and steps, and the CPU time it took."""
    sampling = Sampling.create(temperature, 0, 1.0, seed) if temperature > 0 else Sampling()
    cpu = time.process_time()
    seconds, steps = run(verifier, prompt, DecodeOptions(options.max_tokens, sampling, options.stop_ids), factory)
    return Measured(seconds, steps), time.process_time() - cpu


def bench(verifier: TreeVerifier, prompts: list[tuple[str, list[int]]], options: DecodeOptions,
          temperature: float, modes: dict[str, Factory]) -> dict[tuple[str, str], Totals]:
    totals: dict[tuple[str, str], Totals] = defaultdict(Totals)
    names = list(modes)
    for index, (kind, prompt) in enumerate(prompts):
        order = names[index % len(names):] + names[: index % len(names)]
        results = {mode: decode_once(verifier, prompt, options, temperature, index, modes[mode]) for mode in order}
        for mode, (result, cpu) in results.items():
            if temperature == 0 and result.output != results["plain"][0].output:
                raise AssertionError(f"prompt {index}: {mode} differs from plain greedy decoding")
            totals[kind, mode].add(result, cpu)
            totals["all", mode].add(result, cpu)
        print(f"  {temperature} #{index} {kind}: " + ", ".join(
            f"{mode} {len(r.output) / r.seconds:.1f} tok/s ({len(r.output) / cpu:.1f} per CPU s)"
            for mode, (r, cpu) in results.items()), file=sys.stderr)
    return totals


def table(temperature: float, totals: dict[tuple[str, str], Totals], modes: list[str]) -> list[str]:
    lines = [f"\nTemperature {temperature}:\n",
             "| prompt type | arm | tokens | tokens/s | speed-up | tokens per CPU s | CPU speed-up | acceptance "
             "| accepted per position (1, 2, 3, 4) | mean accepted length |", "|---" * 10 + "|"]
    for kind in dict.fromkeys(kind for kind, _ in totals):
        plain = totals[kind, "plain"]
        for mode in modes:
            t = totals[kind, mode]
            speed = t.tokens / t.seconds
            rate = f"{t.accepted / t.drafted:.2f}" if t.drafted else "-"
            positions = ", ".join(f"{count / t.drafts:.2f}" for count in (t.per_position + [0] * 4)[:4]) \
                if t.drafts else "-"
            ratio = speed / (plain.tokens / plain.seconds)
            cpu_speed = t.tokens / t.cpu_seconds
            cpu_ratio = cpu_speed / (plain.tokens / plain.cpu_seconds)
            lines.append(f"| {kind} | {mode} | {t.tokens} | {speed:.1f} | {ratio:.2f}x | {cpu_speed:.1f} "
                         f"| {cpu_ratio:.2f}x | {rate} | {positions} | {t.tokens / t.steps:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=Path("data/draft/heldout.jsonl"))
    parser.add_argument("--temperatures", default="0,0.7")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--per-class", type=int, help="the first N prompts of each type only")
    parser.add_argument("--drafter", default="eagle3", help="eagle3 (the shipped head) or eagle3:PATH")
    parser.add_argument("--tree", action="append", default=[], metavar="K,DEPTH,NODES,MIN_PROB")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model("default")
    verifier = TreeVerifier(loaded.model)
    modes = arms(args.drafter, loaded.model, args.tree)
    prompts = [(kind, list(loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                tokenize=True, return_dict=False)))
               for kind, messages in read_prompts(args.prompts, args.per_class)]
    options = DecodeOptions(max_tokens=args.max_tokens, stop_ids=frozenset({loaded.tokenizer.eos_token_id}))
    run(verifier, prompts[0][1], options, None)  # warm-up
    print(f"{len(prompts)} prompts from {args.prompts.name}, at most {args.max_tokens} tokens, "
          f"torch threads {torch.get_num_threads()}")
    for temperature in (float(value) for value in args.temperatures.split(",")):
        started = time.perf_counter()
        totals = bench(verifier, prompts, options, temperature, modes)
        print("\n".join(table(temperature, totals, list(modes))))
        print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
