"""A speculation schedule: how many draft tokens a step uses at each batch size.

The format is vLLM's `num_speculative_tokens_per_batch_size` (vLLM 0.32,
`vllm/v1/spec_decode/dynamic/utils.py`): a list of inclusive batch-size
ranges `[[lo, hi, k], ...]`, sorted, non-overlapping, the first starting at 1,
every `k >= 0` (0: the step does not speculate). A batch size in a gap takes
the `k` of the range before it, one past the last range the last `k`, and
every `k` is capped at the engine's `num_speculative_tokens`: vLLM's dense
lookup does the same. Launch profiles (`backends/vllm/`) and the simulator
(`backends/sim/`) read the one format through this class.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Range = tuple[int, int, int]


class ScheduleError(ValueError):
    """A schedule vLLM would refuse, with the reason."""


@dataclass(frozen=True)
class SpeculationSchedule:
    ranges: tuple[Range, ...]

    @classmethod
    def parse(cls, value: Any) -> SpeculationSchedule:
        """From `[[lo, hi, k], ...]` (YAML or JSON), checked as vLLM checks it."""
        if not isinstance(value, list | tuple) or not value:
            raise ScheduleError("a speculation schedule is a non-empty list of [lo, hi, k] ranges")
        ranges = sorted(_range(entry) for entry in value)
        previous_end = 0
        for lo, hi, _ in ranges:
            if lo <= previous_end:
                raise ScheduleError("the batch-size ranges of a speculation schedule must not overlap")
            previous_end = hi
        if ranges[0][0] != 1:
            raise ScheduleError("the first batch-size range of a speculation schedule must start at 1")
        return cls(tuple(ranges))

    @classmethod
    def from_json(cls, text: str) -> SpeculationSchedule:
        """From a command line's JSON text; malformed JSON is a ScheduleError too."""
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ScheduleError(f"not JSON: {exc}") from None
        return cls.parse(value)

    @classmethod
    def switch(cls, max_batch: int, k: int) -> SpeculationSchedule:
        """Speculate with `k` drafts up to `max_batch` sequences, not above."""
        return cls(((1, max_batch, k), (max_batch + 1, max_batch + 1, 0)))

    def tokens_at(self, batch_size: int, num_speculative_tokens: int) -> int:
        """The draft tokens of a step over `batch_size` sequences, capped at
        `num_speculative_tokens` (the engine's configured maximum)."""
        k = self.ranges[0][2]
        for lo, _, range_k in self.ranges:
            if lo > batch_size:
                break
            k = range_k
        return min(k, num_speculative_tokens)

    def max_tokens(self) -> int:
        return max(k for _, _, k in self.ranges)

    def as_list(self) -> list[list[int]]:
        """The JSON value of vLLM's `num_speculative_tokens_per_batch_size`."""
        return [list(entry) for entry in self.ranges]

    def label(self) -> str:
        """`1-8:3 9+:0`: each range's draft tokens, the last one carried on."""
        *head, (lo, _, k) = self.ranges
        return " ".join([*(f"{a}-{b}:{c}" for a, b, c in head), f"{lo}+:{k}"])


def _range(entry: Any) -> Range:
    if not isinstance(entry, Sequence) or isinstance(entry, str) or len(entry) != 3:
        raise ScheduleError(f"each schedule entry is [lo, hi, k], not {entry!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in entry):
        raise ScheduleError(f"schedule entry {list(entry)} must hold three integers")
    lo, hi, k = entry
    if lo <= 0 or hi < lo or k < 0:
        raise ScheduleError(f"schedule entry {list(entry)}: need 1 <= lo <= hi and k >= 0")
    return (lo, hi, k)
