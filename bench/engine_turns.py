"""How long a short request waits behind long ones in the bundled engine.

`--long` chat requests of 192 tokens arrive together; once the first one
streams, a request of 8 tokens arrives. Reported per `max_num_seqs`: the short request's time to
first token and to its end, and when the long ones end. With one sequence
at a time the short request waits for every long one; with turns it waits a
few steps. Greedy, prompt-lookup tree drafts (the engine's defaults).

    python bench/engine_turns.py [--long 2] [--max-num-seqs 1,8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from functools import partial

from prometheus_client import CollectorRegistry

from backends.engine.generate import EngineGenerator
from backends.engine.loading import load_model
from backends.engine.ngram import NgramConfig, NgramDrafter
from backends.serving import GenerationRequest, VllmMetrics

LONG_PROMPT = "Write a story about a lighthouse keeper who finds a message in a bottle."
SHORT_PROMPT = "Name a colour."


class Timing:
    def __init__(self) -> None:
        self.sent = time.perf_counter()
        self.first: float | None = None
        self.done: float | None = None


async def chat(generator: EngineGenerator, text: str, max_tokens: int, timing: Timing,
               streaming: asyncio.Event | None = None) -> None:
    request = GenerationRequest("chat", "bench", "smollm2", messages=({"role": "user", "content": text},),
                                max_tokens=max_tokens, temperature=0)
    try:
        async for _ in generator.generate(request):
            if timing.first is None:
                timing.first = time.perf_counter()
                if streaming is not None:
                    streaming.set()
    finally:  # a failed request must not leave the round waiting for it
        if streaming is not None:
            streaming.set()
    timing.done = time.perf_counter()


async def one_round(generator: EngineGenerator, long_requests: int) -> tuple[Timing, list[Timing]]:
    longs = [Timing() for _ in range(long_requests)]
    first_streams = asyncio.Event()
    tasks = [asyncio.create_task(chat(generator, LONG_PROMPT, 192, t, first_streams)) for t in longs]
    await first_streams.wait()
    short = Timing()
    await chat(generator, SHORT_PROMPT, 8, short)
    await asyncio.gather(*tasks)
    return short, longs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=int, default=2, help="long requests running when the short one arrives")
    parser.add_argument("--max-num-seqs", default="1,8", help="comma-separated values to compare")
    args = parser.parse_args()
    loaded = load_model("default")
    print("| max_num_seqs | short: first token (s) | short: done (s) | long: done (s, mean) |")
    print("|---|---|---|---|")
    for seqs in (int(v) for v in args.max_num_seqs.split(",")):
        config = NgramConfig()
        metrics = VllmMetrics(CollectorRegistry(), "smollm2", num_speculative_tokens=config.max_depth)
        generator = EngineGenerator(loaded.model, loaded.tokenizer, metrics, partial(NgramDrafter, config),
                                    max_num_seqs=seqs)
        short, longs = asyncio.run(one_round(generator, args.long))
        long_done = statistics.mean(t.done - t.sent for t in longs)
        print(f"| {seqs} | {short.first - short.sent:.2f} | {short.done - short.sent:.2f} | {long_done:.2f} |")


if __name__ == "__main__":
    main()
