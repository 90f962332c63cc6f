"""The fleets `specgate plan` weighs, and how each one did on the workload.

An option is a count of replicas of each kind that fills the GPUs:
speculative, standard, and dynamic, each dynamic replica with one of a few
candidate schedules (vLLM's `[[lo, hi, k], ...]` format): all the same, or
staggered, half on one schedule and half on another, so that one replica
stops drafting at a batch where the other still drafts. Each option is
replayed on the same workload (`specgate.plan.fleet`) and scored by goodput:
requests per second that met both objectives, time to first token and time
per output token.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from backends.sim.model import Kind, SimParams
from backends.speculation import SpeculationSchedule
from specgate.plan.fleet import replay
from specgate.plan.workload import Workload

KINDS: tuple[Kind, ...] = ("speculative", "standard", "dynamic")


def candidate_schedules(params: SimParams) -> list[SpeculationSchedule]:
    """Switches off above 8, 16, 32 and 64 sequences, and one that tapers."""
    g = params.num_speculative_tokens
    tapered = SpeculationSchedule(((1, 8, g), (9, 32, max(1, g - 1)), (33, 33, 0)))
    return [*(SpeculationSchedule.switch(switch, g) for switch in (8, 16, 32, 64)), tapered]


@dataclass(frozen=True)
class Option:
    speculative: int
    standard: int
    schedules: tuple[SpeculationSchedule, ...] = ()  # one per dynamic replica

    @property
    def dynamic(self) -> int:
        return len(self.schedules)

    def label(self) -> str:
        parts = [f"{count} {kind}" for kind, count in (("speculative", self.speculative),
                                                       ("standard", self.standard)) if count]
        for schedule, group in itertools.groupby(self.schedules):
            parts.append(f"{len(list(group))} dynamic [{schedule.label()}]")
        return " + ".join(parts)

    def fleet(self, params: SimParams) -> list[tuple[Kind, SimParams]]:
        dynamic: list[tuple[Kind, SimParams]] = [
            ("dynamic", dataclasses.replace(params, speculation_schedule=schedule)) for schedule in self.schedules]
        return [("speculative", params)] * self.speculative + [("standard", params)] * self.standard + dynamic


def options(replicas: int, kinds: Sequence[Kind], schedules: Sequence[SpeculationSchedule]) -> Iterator[Option]:
    """Every way to fill `replicas` with the given kinds: the dynamic replicas
    all on one schedule, or, two and more of them, staggered over two."""
    for speculative in range(replicas + 1):
        for standard in range(replicas + 1 - speculative):
            dynamic = replicas - speculative - standard
            if (speculative and "speculative" not in kinds) or (standard and "standard" not in kinds):
                continue
            if not dynamic:
                yield Option(speculative, standard)
            elif "dynamic" in kinds:
                for schedule in schedules:
                    yield Option(speculative, standard, (schedule,) * dynamic)
                if dynamic >= 2:
                    half = (dynamic + 1) // 2  # the odd replica on the first schedule
                    for first, second in itertools.combinations(schedules, 2):
                        yield Option(speculative, standard, (first,) * half + (second,) * (dynamic - half))


@dataclass(frozen=True)
class Score:
    option: Option
    goodput: float  # requests per second that met both objectives
    slo_met: float  # their share of all requests
    mean_e2e_s: float
    mean_ttft_s: float
    p90_tpot_s: float

    def as_dict(self) -> dict[str, Any]:
        option = self.option
        return {"option": option.label(), "speculative": option.speculative, "standard": option.standard,
                "dynamic": option.dynamic, "schedules": [schedule.as_list() for schedule in option.schedules],
                "goodput_rps": round(self.goodput, 4), "slo_met": round(self.slo_met, 4),
                "mean_e2e_s": round(self.mean_e2e_s, 4), "mean_ttft_s": round(self.mean_ttft_s, 4),
                "p90_tpot_s": round(self.p90_tpot_s, 5)}


def score(option: Option, workload: Workload, params: SimParams, slo: dict[str, float], seed: int) -> Score:
    jobs = replay(option.fleet(params), workload.requests, seed)
    met = sum(1 for job in jobs if job.ttft <= slo["ttft_s"] and job.tpot <= slo["tpot_s"])
    tpots = sorted(job.tpot for job in jobs)
    return Score(option, met / workload.duration_s, met / len(jobs), statistics.fmean(job.e2e for job in jobs),
                 statistics.fmean(job.ttft for job in jobs), tpots[int(0.9 * (len(tpots) - 1))])


def ranked(scores: Sequence[Score]) -> list[Score]:
    """Best first: most goodput, then the lowest mean E2E; goodputs within
    0.5% of the best tie, and the tie goes to the lower mean E2E."""
    best = max(s.goodput for s in scores)

    def key(s: Score) -> tuple[bool, float, float]:
        tied = s.goodput >= best * 0.995
        return (not tied, 0.0 if tied else -s.goodput, s.mean_e2e_s)

    return sorted(scores, key=key)
