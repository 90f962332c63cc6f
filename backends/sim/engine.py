"""The simulated engine: continuous batching on a shared batch clock.

All in-flight requests advance together, one engine step at a time, as in
vLLM's scheduler: a step admits waiting requests (up to `max_num_seqs`),
sleeps for the step time the model gives for that batch, then hands every
running request its tokens for the step. A speculative engine samples how
many of its `g` draft tokens each request accepted (each independently with
probability `a`, the accepted prefix stops at the first rejection) and feeds
the counts to the `vllm:spec_decode_*` counters exactly as vLLM does. A
dynamic engine drafts the tokens its speculation schedule gives for the
step's decoding batch size (none: one token per sequence);
`specgate_sim_steps_total{speculation}` counts the steps each way and
`specgate_sim_speculation_active` says how the last one went.

With a prefix cache (`backends.sim.prefix_cache`) a request's prefill costs
only its uncached tokens: its prompt is looked up when the step admits it,
and its prompt and answer are cached for the turns that follow, which count
in `vllm:prefix_cache_hits_total` and `vllm:prefix_cache_queries_total`.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from backends.serving import Delta, GenerationRequest, VllmMetrics
from backends.serving.generation import estimate_tokens
from backends.sim.model import (
    DEFAULT_PARAMS,
    Kind,
    SimParams,
    acceptance,
    domain_classifier,
    draft_tokens,
    step_seconds,
)
from backends.sim.prefix_cache import PrefixCache, block_hashes

WORDS = {
    "code": ("def", " value", "(", "x", "):", "\n   ", " return", " x", " +", " 1", "\n"),
    "math": (" Let", " x", " =", " 2", ",", " then", " x", "^2", " =", " 4", "."),
    "chat": (" Sure", ",", " here", " is", " a", " short", " answer", " to", " that", "."),
}


@dataclass(eq=False)
class SimRequest:
    """A request inside the engine: its target length and its token inbox."""

    request: GenerationRequest
    text: str
    domain: str
    acceptance: float
    prompt_tokens: int
    target_tokens: int
    finish_reason: str
    emitted: int = 0
    prefill_tokens: int = 0  # the prompt tokens the prefix cache did not hold
    answer: list[str] = field(default_factory=list)
    inbox: asyncio.Queue = field(default_factory=asyncio.Queue)


class SimEngine:
    """A `TokenGenerator` whose timing follows `backends.sim.model`.

    `time_scale` multiplies every simulated duration (0.1 runs ten times
    faster than the modelled GPU); `seed` makes acceptance draws repeatable;
    `prefix_cache`, when given, makes cached prompt prefixes free to prefill.
    """

    def __init__(
        self,
        kind: Kind,
        metrics: VllmMetrics,
        params: SimParams = DEFAULT_PARAMS,
        *,
        time_scale: float = 1.0,
        seed: int | None = None,
        prefix_cache: PrefixCache | None = None,
        model_name: str = "specgate-sim",
    ) -> None:
        self.kind = kind
        self.prefix_cache = prefix_cache
        self.metrics = metrics
        self.params = params
        self.time_scale = time_scale
        self.random = random.Random(seed)
        self.classify = domain_classifier()
        self.waiting: deque[SimRequest] = deque()
        self.running: dict[SimRequest, None] = {}  # an ordered set
        self.steps = 0
        self.domain_quality: dict[str, float] = {}  # POST /control: a draft's acceptance per domain
        self._loop_task: asyncio.Task | None = None
        self.mode_steps = Counter(
            "specgate_sim_steps", "Engine steps with sequences decoding, by whether they drafted",
            ["speculation"], registry=metrics.registry,
        )  # fmt: skip
        self.speculation_active = Gauge(
            "specgate_sim_speculation_active", "1 when the last decoding step drafted",
            registry=metrics.registry,
        )  # fmt: skip
        self.cache_queries, self.cache_hits = (
            Counter(name, doc, ["model_name", "engine"], registry=metrics.registry).labels(model_name, "0")
            for name, doc in (
                ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
                ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
            )
        )  # vLLM V1's names (vllm/v1/metrics/loggers.py), counted in tokens

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        sim = self._admit(request)
        self.waiting.append(sim)
        self._ensure_loop()
        try:
            while True:
                delta = await sim.inbox.get()
                if isinstance(delta, Exception):
                    raise delta
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            self._drop(sim)

    def _admit(self, request: GenerationRequest) -> SimRequest:
        text = request.prompt_text()
        domain = self.classify(text)
        temperature = request.temperature
        if temperature is None:
            temperature = self.params.default_temperature
        target, finish = self.params.output_tokens, "stop"
        if request.max_tokens is not None and request.max_tokens < target:
            target, finish = request.max_tokens, "length"
        return SimRequest(
            request=request,
            text=text,
            domain=domain,
            acceptance=min(0.99, acceptance(domain, temperature, self.params)
                           * self.domain_quality.get(domain, 1.0)),
            prompt_tokens=estimate_tokens(text),
            target_tokens=target,
            finish_reason=finish,
        )

    def set_domain_quality(self, domain: str, factor: float) -> None:
        """Multiply the acceptance of `domain`'s drafts by `factor` from now on,
        for the requests in the batch too (a draft that stops matching a kind
        of prompt mid-run); 1.0 restores the model's own acceptance."""
        old = self.domain_quality.get(domain, 1.0)
        self.domain_quality[domain] = factor
        for sim in (*self.running, *self.waiting):
            if sim.domain == domain:
                sim.acceptance = min(0.99, sim.acceptance / old * factor)

    def _drop(self, sim: SimRequest) -> None:
        if sim in self.running:
            del self.running[sim]
        elif sim in self.waiting:
            self.waiting.remove(sim)

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            await self._clock()
        except Exception as exc:  # noqa: BLE001 - fail the requests, never leave them hanging
            for sim in (*self.running, *self.waiting):
                sim.inbox.put_nowait(exc)
            raise

    async def _clock(self) -> None:
        """The batch clock: one iteration per engine step while work remains.

        Steps end at absolute deadlines (the sum of modelled step times since
        the engine got busy), so the time spent handing out tokens and writing
        responses does not slow the simulated GPU down."""
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while self.running or self.waiting:
            admitted = self._fill_batch()
            self._look_up_prefixes(admitted)
            prefill = sum(sim.prefill_tokens for sim in admitted)
            decoding = [sim for sim in self.running if sim not in admitted]
            seconds = step_seconds(self.kind, len(decoding), prefill, self.params)
            deadline = max(deadline + seconds * self.time_scale, loop.time() - 0.1)
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            self.steps += 1
            # A request admitted this step gets its first token from the prefill.
            for sim in admitted:
                self._emit(sim, 1)
            still_running = [sim for sim in decoding if sim in self.running]
            if decoding:
                self._decode(still_running, draft_tokens(self.kind, len(decoding), self.params))

    def _decode(self, batch: list[SimRequest], drafts: int) -> None:
        self.mode_steps.labels("on" if drafts else "off").inc()
        self.speculation_active.set(int(drafts > 0))
        if drafts:
            self._speculative_step(batch, drafts)
        else:
            for sim in batch:
                self._emit(sim, 1)

    def _fill_batch(self) -> set[SimRequest]:
        admitted = set()
        while self.waiting and len(self.running) < self.params.max_num_seqs:
            sim = self.waiting.popleft()
            self.running[sim] = None
            sim.request.mark_running()
            admitted.add(sim)
        return admitted

    def _look_up_prefixes(self, admitted: set[SimRequest]) -> None:
        """Set each admitted request's prefill to its uncached tokens, then cache
        its prompt: requests admitted in one step do not hit each other's blocks,
        which are computed in that same step."""
        cache = self.prefix_cache
        for sim in admitted:
            sim.prefill_tokens = sim.prompt_tokens
        if cache is None or not admitted:
            return
        lookups = [(sim, cache.lookup(sim.text, sim.prompt_tokens)) for sim in admitted]
        for sim, found in lookups:
            sim.prefill_tokens = found.computed_tokens
            self.cache_queries.inc(found.prompt_tokens)
            self.cache_hits.inc(found.cached_tokens)
        for _, found in lookups:
            cache.store(found.blocks)

    def _speculative_step(self, batch: list[SimRequest], g: int) -> None:
        per_pos = [0] * self.params.num_speculative_tokens
        accepted_total = 0
        for sim in batch:
            accepted = 0
            while accepted < g and self.random.random() < sim.acceptance:
                per_pos[accepted] += 1
                accepted += 1
            accepted_total += accepted
            self._emit(sim, accepted + 1, drafted=g, accepted=accepted)
        if batch:
            self.metrics.observe_spec_decode(len(batch), len(batch) * g, accepted_total, per_pos)

    def _emit(self, sim: SimRequest, tokens: int, *, drafted: int = 0, accepted: int = 0) -> None:
        tokens = min(tokens, sim.target_tokens - sim.emitted)
        if tokens <= 0 or sim not in self.running:
            return
        words = WORDS.get(sim.domain, WORDS["chat"])
        text = "".join(words[(sim.emitted + i) % len(words)] for i in range(tokens))
        sim.emitted += tokens
        sim.answer.append(text)
        done = sim.emitted >= sim.target_tokens
        prompt = sim.prompt_tokens if sim.emitted == tokens else None
        sim.inbox.put_nowait(
            Delta(text, tokens=tokens, finish_reason=sim.finish_reason if done else None,
                  prompt_tokens=prompt, drafted=drafted, accepted=accepted)  # fmt: skip
        )
        if done:
            del self.running[sim]
            if self.prefix_cache is not None:  # the next turn's prompt starts with this one's answer
                answered = sim.text + "\n" + "".join(sim.answer)
                self.prefix_cache.store(block_hashes(answered, self.prefix_cache.block_tokens))
