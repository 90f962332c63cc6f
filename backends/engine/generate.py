"""Decoding loop and the `TokenGenerator` the serving layer drives.

One worker thread owns the model, so torch never runs on the event loop.
Requests wait in a queue; up to `max_num_seqs` of them are active at once and
take turns, one decoding step each, so a short request is not stuck behind a
long one. Each keeps its own KV cache. Text goes back to the request's
coroutine through `loop.call_soon_threadsafe`; a client that leaves sets a
flag the worker checks between steps.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeAlias, runtime_checkable

import torch

from backends.chat_template import stop_tokens
from backends.engine.decoding import Sampling, SequenceState, TreeVerifier
from backends.engine.options import MAX_NUM_SEQS
from backends.engine.tree import DraftTree
from backends.serving import Delta, GenerationRequest, VllmMetrics
from backends.speculation import SpeculationSchedule


class Drafter(Protocol):
    max_depth: int

    def propose(self, tokens: list[int]) -> DraftTree: ...


@runtime_checkable
class FeatureDrafter(Drafter, Protocol):
    """A drafter that reads the target's hidden states entering `aux_layers`
    (EAGLE-3): before each proposal it observes those of the tokens the last
    target pass committed."""

    aux_layers: tuple[int, ...]

    def observe(self, features: torch.Tensor) -> None: ...


@dataclass(frozen=True)
class DecodeOptions:
    max_tokens: int
    sampling: Sampling = Sampling()
    stop_ids: frozenset[int] = frozenset()


@dataclass
class StepStats:
    tokens: list[int]
    draft_depth: int = 0  # draft tokens proposed along the deepest path
    accepted: int = 0


def decode(verifier: TreeVerifier, prompt: list[int], options: DecodeOptions,
           drafter: Drafter | None = None, depth: Callable[[], int] | None = None) -> Iterator[StepStats]:
    """Generate after `prompt`, one verification step at a time (a step yields
    the accepted draft tokens plus the bonus token). Stops at a stop token or
    `max_tokens`. Without a drafter every step is plain decoding; `depth`, asked
    before each step, bounds that step's draft (a drafting schedule: 0 is a
    plain step, and the drafter is not asked)."""
    observer = drafter if isinstance(drafter, FeatureDrafter) else None
    state: SequenceState = verifier.start(prompt, observer.aux_layers if observer else ())
    produced = 0
    while produced < options.max_tokens:
        if observer is not None and state.features is not None:
            observer.observe(state.features)
        limit = options.max_tokens - produced - 1
        if depth is not None:
            limit = min(limit, depth())
        drafts = drafter is not None and (depth is None or limit > 0)
        tree = drafter.propose(state.tokens) if drafter and drafts else DraftTree.root_only(state.tokens[-1])
        tree = tree.pruned(limit)
        result = verifier.step(state, tree, options.sampling)
        tokens = result.new_tokens[: options.max_tokens - produced]
        for i, token in enumerate(tokens):
            if token in options.stop_ids:
                tokens = tokens[: i + 1]
                break
        produced += len(tokens)
        yield StepStats(tokens, tree.depth(), result.accepted)
        if tokens[-1] in options.stop_ids:
            return


@dataclass(eq=False)
class Job:
    prompt: list[int]
    options: DecodeOptions
    emit: Callable[[object], None]  # thread-safe: Delta, an exception, or None at the end
    started: Callable[[], None]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, item: object) -> None:
        """Passes `item` to the request, unless its client has left."""
        if not self.cancelled.is_set():
            self.emit(item)


ActiveJob: TypeAlias = tuple[Job, Iterator[None]]  # a job and its remaining steps


class EngineGenerator:
    """Serves requests from one model; speculative when given a drafter factory,
    and with a `schedule` only as deep as it says for the requests decoding at once."""

    def __init__(self, model: Any, tokenizer: Any, metrics: VllmMetrics,
                 drafter_factory: Callable[[], Drafter] | None = None, max_model_len: int = 2048,
                 max_num_seqs: int = MAX_NUM_SEQS, schedule: SpeculationSchedule | None = None) -> None:
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        self.verifier = TreeVerifier(model)
        self.tokenizer = tokenizer
        self.stop_ids = stop_tokens(tokenizer)  # eos, and the chat template's end of a turn where it differs
        self.metrics = metrics
        self.drafter_factory = drafter_factory
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.schedule = schedule
        self.running = 0  # requests decoding at once, taking turns step by step: the schedule's batch size
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="engine", daemon=True)
        self._worker.start()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        prompt = self.encode(request)
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(prompt)} tokens; this model takes {self.max_model_len}")
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[object] = asyncio.Queue()
        budget = self.max_model_len - len(prompt)
        options = DecodeOptions(
            max_tokens=min(request.max_tokens or budget, budget),
            sampling=Sampling.create(request.temperature if request.temperature is not None else 1.0,
                                     request.top_k or 0, request.top_p if request.top_p is not None else 1.0,
                                     request.seed),
            stop_ids=self.stop_ids)
        job = Job(prompt, options, emit=lambda item: loop.call_soon_threadsafe(inbox.put_nowait, item),
                  started=lambda: loop.call_soon_threadsafe(request.mark_running))
        self._jobs.put(job)
        text = _StopText(request.stop)
        try:
            while (item := await inbox.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, Delta)
                piece, stopped = text.feed(item.text)
                if stopped:
                    yield replace(item, text=piece, finish_reason="stop", prompt_tokens=len(prompt))
                    return
                yield replace(item, text=piece, prompt_tokens=len(prompt))
        finally:
            job.cancelled.set()

    def encode(self, request: GenerationRequest) -> list[int]:
        if request.messages is not None:
            return list(self.tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True,
                                                           tokenize=True, return_dict=False))
        return list(self.tokenizer.encode(request.prompt or ""))

    def _work(self) -> None:
        active: list[ActiveJob] = []
        while True:
            self._admit(active)
            self.running = len(active)
            active[:] = [entry for entry in active if self._advance(*entry)]

    def _admit(self, active: list[ActiveJob]) -> None:
        """Takes waiting jobs while there is room; blocks only when idle."""
        while len(active) < self.max_num_seqs:
            try:
                job = self._jobs.get(block=not active)
            except queue.Empty:
                return
            if not job.cancelled.is_set():
                job.started()
                active.append((job, self._steps(job)))

    @staticmethod
    def _advance(job: Job, steps: Iterator[None]) -> bool:
        """Runs one step of `job`; False once the job has ended."""
        try:
            next(steps)
            return True
        except StopIteration:
            pass
        except Exception as exc:  # noqa: BLE001 - reaches the request as its error
            job.send(exc)
        job.send(None)
        return False

    def _steps(self, job: Job) -> Iterator[None]:
        """Decodes `job`, emitting its text; yields after every model step."""
        drafter = self.drafter_factory() if self.drafter_factory else None
        depth = None
        if drafter is not None and (schedule := self.schedule) is not None:
            def depth() -> int:
                return schedule.tokens_at(self.running, drafter.max_depth)
        output: list[int] = []
        sent = ""
        produced = pending = 0
        for step in decode(self.verifier, job.prompt, job.options, drafter, depth):
            if job.cancelled.is_set():
                return
            if drafter is not None and step.draft_depth:
                per_position = [1 if i < step.accepted else 0 for i in range(step.draft_depth)]
                self.metrics.observe_spec_decode(1, step.draft_depth, step.accepted, per_position)
            output += step.tokens
            produced += len(step.tokens)
            pending += len(step.tokens)
            text = self.tokenizer.decode(output, skip_special_tokens=True)
            finished = step.tokens[-1] in job.options.stop_ids or produced >= job.options.max_tokens
            reason = ("stop" if step.tokens[-1] in job.options.stop_ids else "length") if finished else None
            drafted = step.draft_depth if drafter is not None else 0
            accepted = step.accepted if drafted else 0
            if finished or not text.endswith("\ufffd"):  # else half a multi-byte character: wait
                job.send(Delta(text[len(sent):], tokens=pending, finish_reason=reason, drafted=drafted,
                               accepted=accepted))
                sent, pending = text, 0
            elif drafted:  # no text yet, but the step's acceptance counts in the answer's metrics
                job.send(Delta("", tokens=0, drafted=drafted, accepted=accepted))
            yield


class _StopText:
    """Cuts the text at the first stop string (the stop string itself is dropped)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.seen = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        if not self.stops:
            return piece, False
        before = len(self.seen)
        self.seen += piece
        cuts = [i for i in (self.seen.find(s) for s in self.stops) if i >= 0]
        if not cuts:
            return piece, False
        return self.seen[before:max(before, min(cuts))], True
