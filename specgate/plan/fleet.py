"""A fleet of simulated replicas replaying a workload, in simulated time.

Each replica is the simulator's engine (backends/sim) without the clock:
continuous batching, one step at a time, the step time and the draft tokens
of `backends.sim.model` for its kind and batch size (a dynamic replica drafts
what its schedule says), each sequence's accepted drafts drawn from its
acceptance. Nothing sleeps, so a minute of traffic replays in well under a
second. A request goes to the replica where its own predicted E2E is
lowest: the step time at the batch it would join, over the tokens a step
gives it there (least loaded, in a fleet of one kind).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from backends.sim.model import Kind, SimParams, acceptance, draft_tokens, expected_tokens_per_step, step_seconds
from specgate.plan.workload import PlannedRequest


@dataclass(eq=False)
class Job:
    request: PlannedRequest
    target: int
    acceptance: float
    first_at: float | None = None
    done_at: float | None = None
    emitted: int = 0

    @property
    def ttft(self) -> float:
        assert self.first_at is not None
        return self.first_at - self.request.at

    @property
    def e2e(self) -> float:
        assert self.done_at is not None
        return self.done_at - self.request.at

    @property
    def tpot(self) -> float:
        assert self.done_at is not None and self.first_at is not None
        return (self.done_at - self.first_at) / (self.target - 1) if self.target > 1 else 0.0


class Replica:
    """One engine: its queue, its batch, the step in flight."""

    def __init__(self, kind: Kind, params: SimParams, rng: random.Random) -> None:
        self.kind, self.params, self.rng = kind, params, rng
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.step: tuple[list[Job], list[Job]] | None = None  # (admitted, decoding) of the step in flight

    def predicted_e2e(self, job: Job) -> float:
        batch = min(len(self.running) + len(self.waiting) + 1, self.params.max_num_seqs)
        k = draft_tokens(self.kind, batch, self.params)
        per_step = expected_tokens_per_step(job.acceptance, k) if k else 1.0
        return step_seconds(self.kind, batch, 0, self.params) * job.target / per_step

    def start_step(self, now: float) -> float | None:
        """Begin the next step; its end time, or None when there is nothing to do."""
        if not (self.waiting or self.running):
            self.step = None
            return None
        admitted: list[Job] = []
        while self.waiting and len(self.running) < self.params.max_num_seqs:
            admitted.append(self.waiting.popleft())
        decoding = list(self.running)
        self.running += admitted
        prefill = sum(job.request.prompt_tokens for job in admitted)
        self.step = (admitted, decoding)
        return now + step_seconds(self.kind, len(decoding), prefill, self.params)

    def finish_step(self, now: float) -> None:
        assert self.step is not None
        admitted, decoding = self.step
        for job in admitted:
            self._emit(job, 1, now)
        k = draft_tokens(self.kind, len(decoding), self.params)
        for job in decoding:
            accepted = 0
            while accepted < k and self.rng.random() < job.acceptance:
                accepted += 1
            self._emit(job, accepted + 1, now)
        self.running = [job for job in self.running if job.done_at is None]

    def _emit(self, job: Job, tokens: int, now: float) -> None:
        if job.first_at is None:
            job.first_at = now
        job.emitted = min(job.target, job.emitted + tokens)
        if job.emitted >= job.target:
            job.done_at = now


def jobs_for(requests: Sequence[PlannedRequest], params: SimParams) -> list[Job]:
    jobs = []
    for request in requests:
        target = params.output_tokens if request.max_tokens is None else min(request.max_tokens, params.output_tokens)
        a = request.acceptance
        if a is None:
            a = acceptance(request.domain, request.temperature, params)
        jobs.append(Job(request, max(1, target), min(0.99, a * request.quality)))
    return jobs


def replay(kinds: Sequence[tuple[Kind, SimParams]], requests: Sequence[PlannedRequest], seed: int = 0) -> list[Job]:
    """Every request served by a fleet of `kinds`; the jobs with their times."""
    rng = random.Random(seed)
    replicas = [Replica(kind, params, rng) for kind, params in kinds]
    jobs = jobs_for(requests, kinds[0][1])
    steps: list[tuple[float, int, int]] = []  # (end, sequence number, replica)
    sequence = 0
    arrivals = deque(sorted(jobs, key=lambda job: job.request.at))
    while arrivals or steps:
        if steps and (not arrivals or steps[0][0] <= arrivals[0].request.at):
            now, _, index = heapq.heappop(steps)
            replicas[index].finish_step(now)
        else:
            job = arrivals.popleft()
            now = job.request.at
            index = min(range(len(replicas)), key=lambda i: (replicas[i].predicted_e2e(job), i))
            replicas[index].waiting.append(job)
            if replicas[index].step is not None:
                continue
        end = replicas[index].start_step(now)
        if end is not None:
            heapq.heappush(steps, (end, sequence, index))
            sequence += 1
    return jobs
