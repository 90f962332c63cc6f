"""The dynamic kind: engine-level dynamic speculation, on while the decoding
batch is at most `speculative_max_batch` sequences and off above it."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from backends.serving import GenerationRequest, VllmMetrics
from backends.sim.engine import SimEngine
from backends.sim.model import SimParams, draft_tokens, speculates, step_seconds
from backends.speculation import SpeculationSchedule
from specgate.commands.sim import add_arguments, params_from


@pytest.mark.parametrize("batch,speculating", [(1, True), (32, True), (33, False), (256, False)])
def test_the_dynamic_kind_costs_a_speculative_step_up_to_the_threshold(batch, speculating):
    assert speculates("dynamic", batch) is speculating
    like = "speculative" if speculating else "standard"
    assert step_seconds("dynamic", batch, 100) == step_seconds(like, batch, 100)


def test_the_other_kinds_ignore_the_threshold():
    assert speculates("speculative", 1000) and not speculates("standard", 1)


def requests(*max_tokens: int) -> list[GenerationRequest]:
    return [GenerationRequest(endpoint="chat", request_id=f"r{i}", model="sim", max_tokens=n, temperature=0.0,
                              messages=({"role": "user", "content": "Tell me about rivers."},))
            for i, n in enumerate(max_tokens)]


def test_speculation_is_off_while_the_batch_is_large_and_on_once_it_shrinks():
    registry = CollectorRegistry()
    metrics = VllmMetrics(registry, "sim", num_speculative_tokens=3)
    engine = SimEngine("dynamic", metrics, dataclasses.replace(SimParams(), speculative_max_batch=2),
                       time_scale=0.001, seed=1)

    async def answer(request: GenerationRequest) -> list[int]:
        return [delta.tokens async for delta in engine.generate(request)]

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(answer(r) for r in requests(10, 10, 40, 40)))

    short_a, short_b, long_a, long_b = asyncio.run(main())

    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        value = registry.get_sample_value(name, {"engine": "0", "model_name": "sim"} if labels is None else labels)
        return 0.0 if value is None else value

    # four decode one token a step (off) until the short two finish; then two draft (on)
    assert short_a == short_b == [1] * 10
    assert sample("specgate_sim_steps_total", {"speculation": "off"}) == 9
    on = sample("specgate_sim_steps_total", {"speculation": "on"})
    assert on >= 1 and max(long_a[10:]) > 1  # several tokens a step once speculating
    drafts = sample("vllm:spec_decode_num_drafts_total")
    assert 0 < drafts <= 2 * on
    assert sample("vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
    assert sum(long_a) == sum(long_b) == 40
    assert sample("specgate_sim_speculation_active", {}) == 1


def test_the_command_takes_the_dynamic_kind_and_its_threshold():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--kind", "dynamic", "--port", "1", "--speculative-max-batch", "8"])
    assert (args.kind, args.speculative_max_batch) == ("dynamic", 8)


SCHEDULE = SpeculationSchedule.parse([[1, 4, 3], [5, 8, 2], [9, 256, 0]])


@pytest.mark.parametrize("batch,drafts", [(1, 3), (4, 3), (5, 2), (8, 2), (9, 0), (200, 0)])
def test_a_schedule_sets_the_step_cost_batch_size_by_batch_size(batch, drafts):
    params = SimParams(speculation_schedule=SCHEDULE)
    assert draft_tokens("dynamic", batch, params) == drafts
    like = dataclasses.replace(SimParams(), num_speculative_tokens=drafts) if drafts else SimParams()
    assert step_seconds("dynamic", batch, 100, params) == step_seconds(
        "speculative" if drafts else "standard", batch, 100, like)


def test_the_engine_drafts_what_the_schedule_says_and_reports_it_per_delta():
    metrics = VllmMetrics(CollectorRegistry(), "sim", num_speculative_tokens=3)
    schedule = SpeculationSchedule.parse([[1, 2, 3], [3, 256, 0]])
    engine = SimEngine("dynamic", metrics, SimParams(speculation_schedule=schedule), time_scale=0.001, seed=2)

    async def answer(request: GenerationRequest) -> list[int]:
        return [delta.drafted async for delta in engine.generate(request)]

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(answer(r) for r in requests(6, 6, 6, 60)))

    *short, long = asyncio.run(main())
    assert all(set(drafted) == {0} for drafted in short)  # four decoding: above the switch
    assert set(long[6:]) == {3}  # alone once the three short ones are done: three drafts a step


def test_the_command_takes_a_schedule_in_vllms_format():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--kind", "dynamic", "--port", "1", "--speculation-schedule", "[[1, 4, 3], [5, 9, 0]]"])
    assert params_from(args).speculation_schedule == SpeculationSchedule(((1, 4, 3), (5, 9, 0)))
    bad = parser.parse_args(["--kind", "dynamic", "--port", "1", "--speculation-schedule", "[[2, 4, 3]]"])
    with pytest.raises(SystemExit, match="must start at 1"):
        params_from(bad)
