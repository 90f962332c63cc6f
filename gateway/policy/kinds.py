"""Kinds of pool, as one table: what each kind drafts at a batch size, whether it
reports acceptance, and which launch profile serves it.

A kind is a row of `KINDS`. Everything that used to ask "is this pool
speculative?" asks the kind instead, through the pool's `Schedule`: how many
tokens it drafts when `b` sequences decode together. The latency model's prior
curve follows from the schedule (gateway/decide/latency_priors.py), so a new kind
is one row here and, where its curve is not a schedule, one prior.

- `speculative`: drafts `draft_tokens` at every batch size.
- `standard`: never drafts.
- `dynamic`: drafts by its declared `speculation_schedule`, vLLM's
  `num_speculative_tokens_per_batch_size` ranges `[[lo, hi, k], ...]`, read
  as vLLM reads them: a batch size takes the k of the last range starting at or
  below it, so a gap keeps the range before and the last range holds for every
  larger batch. A schedule stops drafting with a range of its own,
  `[hi + 1, ..., 0]`; one k at every size is not dynamic and is refused.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

UNBOUNDED = 1 << 30  # "any batch size" as a range's upper end, and the highest a schedule may name
MAX_DRAFT_TOKENS = 32  # the deepest draft a policy may state, in a schedule or the priors' draft_tokens


class PoolKind(enum.StrEnum):
    SPECULATIVE = "speculative"
    STANDARD = "standard"
    DYNAMIC = "dynamic"


@dataclass(frozen=True, slots=True)
class Schedule:
    """Draft tokens per decoding batch size, as inclusive (lo, hi, k) ranges."""
    ranges: tuple[tuple[int, int, int], ...] = ()
    ever_drafts: bool = field(init=False, repr=False, compare=False)  # some batch size drafts
    # The loads (sequences running) past which one more drafts unlike at the load below: where
    # a stretch of one drafting count starts, for the room's search (LatencyModel.room).
    stretches: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)  # the latency model's tables are keyed by schedule

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.ranges))
        object.__setattr__(self, "ever_drafts", any(k > 0 for _, _, k in self.ranges))
        starts, before = [], 0
        for lo, _, k in self.ranges:
            if k != before and lo > 1:
                starts.append(lo - 1)  # the batch `lo` is that load plus the one more
            before = k
        object.__setattr__(self, "stretches", tuple(starts))

    def __hash__(self) -> int:
        return self._hash

    def drafts(self, batch: int) -> int:
        """vLLM's lookup: the k of the last range that starts at or below `batch`."""
        drafted = 0
        for lo, _, k in self.ranges:
            if lo > batch:
                break
            drafted = k
        return drafted

    def to_json(self) -> list[list[int]]:
        return [list(r) for r in self.ranges]


@dataclass(frozen=True, slots=True)
class KindTraits:
    schedule: Callable[[int, Schedule | None], Schedule]  # (draft_tokens, declared) -> the pool's schedule
    reports_acceptance: bool  # its answers carry acceptance; the guard watches it
    profile: str  # the launch profile family that serves it (backends/vllm/profiles.yaml)
    declares_schedule: bool = False  # the policy must state `speculation_schedule`


KINDS: MappingProxyType[PoolKind, KindTraits] = MappingProxyType({
    PoolKind.SPECULATIVE: KindTraits(lambda k, _: Schedule(((1, UNBOUNDED, k),)), True, "speculative"),
    PoolKind.STANDARD: KindTraits(lambda k, _: Schedule(), False, "standard"),
    PoolKind.DYNAMIC: KindTraits(lambda k, declared: declared or Schedule(), True, "dynamic",
                                 declares_schedule=True),
})


def schedule_of(kind: PoolKind, draft_tokens: int, declared: Sequence[Sequence[int]] | None = None) -> Schedule:
    """The pool's drafting schedule from its kind's row."""
    given = None if declared is None else Schedule(tuple((int(lo), int(hi), int(k)) for lo, hi, k in declared))
    return KINDS[kind].schedule(draft_tokens, given)


def check_schedule(ranges: Sequence[Sequence[int]]) -> list[str]:
    """What is wrong with a declared schedule: shape, order, overlap, values out of bounds (`specgate up`
    starts a dynamic replica drafting as deep as its deepest step)."""
    problems: list[str] = []
    previous_hi = 0
    for i, item in enumerate(ranges):
        if len(item) != 3:
            problems.append(f"[{i}] must be [lo, hi, k], got {list(item)}")
            continue
        lo, hi, k = item
        if not (1 <= lo <= hi <= UNBOUNDED and 0 <= k <= MAX_DRAFT_TOKENS):
            problems.append(f"[{i}] needs 1 <= lo <= hi <= {UNBOUNDED} and 0 <= k <= {MAX_DRAFT_TOKENS}, "
                            f"got [{lo}, {hi}, {k}]")
        elif lo <= previous_hi:
            problems.append(f"[{i}] overlaps or precedes the range before it (ranges go up by batch size)")
        else:
            previous_hi = hi
    if problems or not ranges:
        return problems
    if ranges[0][0] != 1:
        problems.append("the first range starts at batch size 1")
    drafted = {k for _, _, k in ranges}
    if len(drafted) == 1:
        k = drafted.pop()
        instead = "kind: speculative" if k else "kind: standard"
        problems.append(f"it drafts {k} at every batch size (the last range holds for every larger batch, "
                        f"as in vLLM): end it with [{ranges[-1][1] + 1}, {ranges[-1][1] + 1}, 0] to stop "
                        f"drafting there, or use {instead}")
    return problems
