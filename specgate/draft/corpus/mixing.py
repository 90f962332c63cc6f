"""Draw distinct prompts from weighted makers: the loop the generated sources share."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

Row = dict[str, object]
Made = tuple[str, str | list[dict[str, str]]]  # (class, a user turn's text or whole messages)
Maker = Callable[[random.Random], Made]


def distinct(rng: random.Random, count: int, kinds: Sequence[tuple[Maker, int]], source: str) -> list[Row]:
    """Up to `count` distinct prompts, each from a maker drawn by weight (gives up after 20x tries)."""
    makers, weights = zip(*kinds, strict=True)
    out: list[Row] = []
    seen: set[str] = set()
    for _ in range(count * 20):
        if len(out) >= count:
            break
        traffic_class, made = rng.choices(makers, weights)[0](rng)
        messages = [{"role": "user", "content": made}] if isinstance(made, str) else made
        key = repr(messages)
        if key not in seen:
            seen.add(key)
            out.append({"class": traffic_class, "source": source, "messages": messages})
    return out
