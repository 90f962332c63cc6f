"""The simulator's prefix cache: vLLM-style chained block hashes, LRU by
blocks, prefill charged for uncached tokens only, vLLM's counters."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

import backends.sim.engine
from backends.serving.server import BackgroundServer
from backends.sim.model import DEFAULT_PARAMS, Kind, SimParams
from backends.sim.prefix_cache import BLOCK_TOKENS, CHARS_PER_TOKEN, PrefixCache, block_hashes
from backends.sim.server import create_sim_app

BLOCK = "x" * (BLOCK_TOKENS * CHARS_PER_TOKEN)
SYSTEM = "".join(f"Rule {i}: answer briefly and politely, in plain English words. " for i in range(40))


def text_of(*blocks: str) -> str:
    return "".join(blocks)


def test_blocks_chain_so_only_the_same_prefix_matches() -> None:
    a, b = "a" * len(BLOCK), "b" * len(BLOCK)
    assert len(block_hashes(a + b + "tail")) == 2  # only full blocks
    assert block_hashes(a + b)[1] != block_hashes(b + b)[1]  # same block, other parent
    cache = PrefixCache(capacity_blocks=100)
    cache.store(block_hashes(a + b))
    assert cache.lookup(a + b + a, 3 * BLOCK_TOKENS).cached_tokens == 2 * BLOCK_TOKENS
    assert cache.lookup(b + b, 2 * BLOCK_TOKENS).cached_tokens == 0
    found = cache.lookup(a + b, 2 * BLOCK_TOKENS)  # a full hit still computes the last token
    assert found.cached_tokens == 2 * BLOCK_TOKENS - 1 and found.computed_tokens == 1


def test_lru_evicts_the_least_recent_chain_tail_first() -> None:
    cache = PrefixCache(capacity_blocks=3)
    old, new = text_of("o" * len(BLOCK), "p" * len(BLOCK)), text_of("n" * len(BLOCK))
    cache.store(block_hashes(old))
    cache.store(block_hashes(new))
    cache.store(block_hashes(new + "q" * len(BLOCK)))  # 4 blocks now: one goes
    assert len(cache) == 3
    # the old chain lost its tail, not its head: its first block still matches
    assert cache.lookup(old, 1000).cached_tokens == BLOCK_TOKENS
    assert cache.lookup(new + "q" * len(BLOCK), 1000).cached_tokens == 2 * BLOCK_TOKENS
    with pytest.raises(ValueError):
        PrefixCache(0)


@pytest.fixture
def serve() -> Iterator:
    servers: list[BackgroundServer] = []

    def start(prefix_cache: bool = True) -> str:
        app, _ = create_sim_app("standard", "sim", time_scale=0.01, seed=1, prefix_cache=prefix_cache)
        servers.append(BackgroundServer(app).start())
        return servers[-1].url

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def prefills(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The prefill tokens of every step the engine times."""
    seen: list[int] = []
    real = backends.sim.engine.step_seconds

    def spy(kind: Kind, batch_size: int, prefill_tokens: int = 0, params: SimParams = DEFAULT_PARAMS) -> float:
        seen.append(prefill_tokens)
        return real(kind, batch_size, prefill_tokens, params)

    monkeypatch.setattr(backends.sim.engine, "step_seconds", spy)
    return seen


def counters(url: str) -> tuple[float, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["vllm:prefix_cache_hits_total"], values["vllm:prefix_cache_queries_total"]


def two_turns(url: str) -> tuple[int, int]:
    """A conversation's two turns; their prompt token counts."""
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a river."}]
        first = client.chat.completions.create(model="sim", messages=messages, max_tokens=40)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And a longer one?"}]  # fmt: skip
        second = client.chat.completions.create(model="sim", messages=messages, max_tokens=40)
    assert first.usage and second.usage
    return first.usage.prompt_tokens, second.usage.prompt_tokens


def test_the_second_turn_prefills_only_what_is_new(serve, prefills: list[int]) -> None:
    url = serve()
    first, second = two_turns(url)
    hits, queries = counters(url)
    assert queries == first + second
    # turn 1 found nothing; turn 2 found turn 1's prompt and answer, whole blocks of them
    answered = len(SYSTEM + "\nName a river.\n") // CHARS_PER_TOKEN + 40
    assert answered // BLOCK_TOKENS * BLOCK_TOKENS - BLOCK_TOKENS <= hits <= answered
    assert [p for p in prefills if p] == [first, second - hits]


def test_without_the_cache_every_prompt_is_prefilled(serve, prefills: list[int]) -> None:
    url = serve(prefix_cache=False)
    first, second = two_turns(url)
    assert counters(url) == (0.0, 0.0)
    assert [p for p in prefills if p] == [first, second]


def test_the_command_line_sizes_or_turns_off_the_cache() -> None:
    import argparse

    from specgate.commands.sim import add_arguments, params_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--kind", "standard", "--port", "1", "--prefix-cache-tokens", "1600"])
    assert args.prefix_cache and params_from(args).prefix_cache_tokens == 1600
    assert not parser.parse_args(["--kind", "standard", "--port", "1", "--no-prefix-cache"]).prefix_cache
    with pytest.raises(SystemExit):
        params_from(parser.parse_args(["--kind", "standard", "--port", "1", "--prefix-cache-tokens", "0"]))
