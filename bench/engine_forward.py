"""Cost of one target forward pass by the number of tokens it scores.

What tree verification pays on this CPU: SmolLM2-135M-Instruct (float32)
with a 200-token cache scores 1..32 new tokens in one pass, with the linear
layers as transformers builds them and packed for oneDNN. Median of
`--repeats` passes; the cache is cropped back after each.

    python bench/engine_forward.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from backends.engine.forward import crop, extend_chain, new_cache
from backends.engine.loading import load_model

TOKENS_SCORED = (1, 2, 4, 8, 12, 16, 32)
CACHED = 200


def pass_ms(model: Any, scored: int, repeats: int) -> float:
    cache = new_cache(model)
    extend_chain(model, cache, list(range(100, 100 + CACHED)))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        extend_chain(model, cache, list(range(5, 5 + scored)))
        times.append(time.perf_counter() - started)
        crop(cache, CACHED)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    models = {"as built": load_model("default", pack=False).model, "packed": load_model("default").model}
    print("| tokens scored | " + " | ".join(f"{name} (ms)" for name in models) + " | packed vs 1 token |")
    print("|---|" + "---|" * (len(models) + 1))
    single = pass_ms(models["packed"], 1, args.repeats)
    for scored in TOKENS_SCORED:
        costs = {name: pass_ms(model, scored, args.repeats) for name, model in models.items()}
        print(f"| {scored} | " + " | ".join(f"{ms:.1f}" for ms in costs.values())
              + f" | {costs['packed'] / single:.2f}x |")


if __name__ == "__main__":
    main()
