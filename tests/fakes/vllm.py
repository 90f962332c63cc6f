"""A controllable fake vLLM server for tests, built on the serving layer.

It speaks vLLM's wire format and exports vLLM's metrics (both from
`backends.serving`), runs as a real HTTP server on 127.0.0.1, and lets a test
script its answers, hold a stream, watch for client disconnects, inject
faults, set metrics and read back the requests it received::

    with FakeVllm(model="fake-model", kind="speculative") as fake:
        fake.script(text="Hello there", chunks=4, delay=0.01)
        hold = fake.hold()                  # streams pause after chunk 1
        ...                                 # client reads chunk 1
        hold.set()                          # the rest flows
        fake.fail_next(2, status=503)       # the next two /v1 calls fail
        fake.record_spec_decode(num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12)
        fake.set_load(running=8, waiting=2)
        fake.acceptance = lambda request: 0.2 if (request.temperature or 0) > 1 else 0.8
        assert fake.wait_disconnect(5)      # the client hung up mid-request
        fake.requests[-1].body["model"]

Run as a process (soak tests): `python -m tests.fakes.vllm_command --port 8001 --kind standard`.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.serving import Delta, GenerationRequest, VllmMetrics, create_openai_app
from backends.serving.server import BackgroundServer
from tests.fakes.faults import FaultInjector, Faults, RecordedRequest

Kind = Literal["speculative", "standard"]


@dataclass(frozen=True)
class Script:
    """How the fake answers: `text` cut into `chunks` pieces of `tokens`
    tokens each (more than one: a speculative step's accepted tokens, sent in
    one event), `delay` seconds before each piece. `max_tokens` below `chunks`
    truncates the answer with finish_reason "length"."""

    text: str = "Hello from the fake vLLM server."
    chunks: int = 4
    delay: float = 0.0
    finish_reason: str = "stop"
    tokens: int = 1

    def pieces(self) -> list[str]:
        """`text` in `chunks` pieces, cut between words when there are enough."""
        count = max(1, self.chunks)
        words = re.findall(r"\s*\S+\s*", self.text)
        units = words if len(words) >= count else list(self.text)
        if len(units) < count:
            units += [""] * (count - len(units))
        bounds = [round(i * len(units) / count) for i in range(count + 1)]
        return ["".join(units[bounds[i] : bounds[i + 1]]) for i in range(count)]


@dataclass(frozen=True)
class Disconnect:
    """A request whose client went away before the answer was complete."""

    path: str
    request_id: str
    at: float  # time.monotonic()
    chunks_sent: int


class FakeGenerator:
    """Plays the current `Script`, pausing on the hold event and noting
    cancellations (the serving app cancels on client disconnect)."""

    def __init__(self, fake: FakeVllm) -> None:
        self.fake = fake

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        fake = self.fake
        script = fake.current_script
        pieces = script.pieces()
        finish = script.finish_reason
        if request.max_tokens is not None and request.max_tokens < len(pieces):
            pieces, finish = pieces[: request.max_tokens], "length"
        sent = 0
        steps = fake.verify_steps(request, script)
        try:
            for index, piece in enumerate(pieces):
                if script.delay:
                    await asyncio.sleep(script.delay)
                last = index == len(pieces) - 1
                drafted, accepted, tokens = next(steps)
                yield Delta(piece, tokens=tokens, finish_reason=finish if last else None,
                            drafted=drafted, accepted=accepted)
                sent += 1
                fake.after_chunk(sent)
                if not last:
                    await fake.wait_while_held()
        except asyncio.CancelledError:
            fake.note_disconnect(request, sent)
            raise


class FakeVllm:
    """A fake vLLM on `http://127.0.0.1:<port>` (a free port unless given).

    `kind="speculative"` exports the spec-decode counters with
    `num_speculative_tokens` positions; with `spec_acceptance` set, every
    served token also counts as a draft of that many tokens of which
    `round(spec_acceptance * k)` were accepted, so counters move with traffic.

    A speculative fake answers like vLLM run with
    `--per-request-spec-decode-metrics summary`: each chunk is one verify step
    of `k` drafts, and the answer carries `metrics.speculative_decoding`.
    `acceptance` sets the share of drafts accepted per request class: a
    number, or a function of the `GenerationRequest` (e.g. lower at high
    temperature); each chunk then holds `accepted + 1` tokens and the
    spec-decode counters count the steps. Unset, a chunk of `Script.tokens`
    tokens counts as `tokens - 1` drafts accepted.
    """

    def __init__(
        self,
        model: str = "fake-model",
        kind: Kind = "speculative",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        num_speculative_tokens: int = 3,
        spec_acceptance: float | None = None,
        script: Script | None = None,
        acceptance: float | Callable[[GenerationRequest], float] | None = None,
    ) -> None:
        if kind not in ("speculative", "standard"):
            raise ValueError(f"kind must be 'speculative' or 'standard', not {kind!r}")
        self.model = model
        self.kind = kind
        self.spec_acceptance = spec_acceptance
        self.acceptance = acceptance
        self.num_speculative_tokens = num_speculative_tokens if kind == "speculative" else 0
        self.current_script = script or Script()
        self.healthy = True
        # Answer with the request's x-request-id, as vLLM run with --enable-request-id-headers.
        self.echo_request_id = False
        self.faults = Faults()
        self.metrics = VllmMetrics(
            CollectorRegistry(),
            model,
            num_speculative_tokens=num_speculative_tokens if kind == "speculative" else None,
        )
        self._lock = threading.Lock()
        self._hold: threading.Event | None = None
        self.holding = threading.Event()
        self.disconnects: list[Disconnect] = []
        self._disconnected = threading.Event()
        app = create_openai_app(
            FakeGenerator(self), self.metrics, model, max_model_len=2048,
            healthy=lambda: self.healthy, spec_decode_metrics=self.num_speculative_tokens or None,
        )  # fmt: skip
        self._injector = FaultInjector(app, self.faults)
        self._server = BackgroundServer(
            _echo_request_id(self._injector, lambda: self.echo_request_id), host=host, port=port
        )

    # Lifecycle -------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> FakeVllm:
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving; open connections are dropped. `start()` reopens the same port."""
        self.release()
        self._server.stop()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> FakeVllm:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # Answers ---------------------------------------------------------------

    def script(
        self,
        text: str | None = None,
        chunks: int | None = None,
        delay: float | None = None,
        finish_reason: str | None = None,
        tokens: int | None = None,
    ) -> Script:
        """Change how later requests are answered; omitted fields are kept."""
        current = self.current_script
        self.current_script = Script(
            text=current.text if text is None else text,
            chunks=current.chunks if chunks is None else chunks,
            delay=current.delay if delay is None else delay,
            finish_reason=current.finish_reason if finish_reason is None else finish_reason,
            tokens=current.tokens if tokens is None else tokens,
        )
        return self.current_script

    def hold(self) -> threading.Event:
        """From now on answers pause after their first chunk until the returned
        event is set. `holding` is set while an answer is paused."""
        with self._lock:
            self._hold = threading.Event()
            return self._hold

    def release(self) -> None:
        with self._lock:
            if self._hold is not None:
                self._hold.set()
            self._hold = None

    async def wait_while_held(self) -> None:
        hold = self._hold
        if hold is None or hold.is_set():
            return
        self.holding.set()
        try:
            while not hold.is_set():
                await asyncio.sleep(0.005)
        finally:
            self.holding.clear()

    def after_chunk(self, sent: int) -> None:
        if self.spec_acceptance is not None and self.acceptance is None and self.metrics.speculative:
            k = self.metrics.num_speculative_tokens or 0
            accepted = round(self.spec_acceptance * k)
            per_pos = [1 if pos < accepted else 0 for pos in range(k)]
            self.metrics.observe_spec_decode(1, k, accepted, per_pos)

    def verify_steps(self, request: GenerationRequest, script: Script) -> Iterator[tuple[int, int, int]]:
        """(drafted, accepted, tokens) of each chunk of an answer. With an
        `acceptance`, accepted drafts are spread evenly so that their share
        over the answer is that acceptance (to within one draft)."""
        k = self.num_speculative_tokens
        rule = self.acceptance
        if not k:
            while True:
                yield 0, 0, script.tokens
        if rule is None:
            while True:
                yield k, max(0, min(script.tokens - 1, k)), script.tokens
        share = min(1.0, max(0.0, rule(request) if callable(rule) else rule))
        owed = 0.0
        while True:
            owed += share * k
            accepted = min(k, int(owed + 1e-9))
            owed -= accepted
            self.metrics.observe_spec_decode(1, k, accepted, [1 if pos < accepted else 0 for pos in range(k)])
            yield k, accepted, accepted + 1

    # Disconnects -----------------------------------------------------------

    def note_disconnect(self, request: GenerationRequest, chunks_sent: int) -> None:
        path = "/v1/chat/completions" if request.endpoint == "chat" else "/v1/completions"
        with self._lock:
            self.disconnects.append(
                Disconnect(path, request.request_id, time.monotonic(), chunks_sent)
            )
        self._disconnected.set()

    def wait_disconnect(self, timeout: float = 5.0) -> bool:
        """True once the server saw a client leave before its answer was done."""
        return self._disconnected.wait(timeout)

    # Faults ----------------------------------------------------------------

    def fail_next(
        self, count: int = 1, status: int = 500, message: str = "injected failure"
    ) -> None:
        """The next `count` /v1 requests answer `status` with a vLLM error body."""
        with self.faults.lock:
            self.faults.fail_count = count
            self.faults.fail_status = status
            self.faults.fail_message = message

    def delay_first_byte(self, seconds: float, count: int = 1) -> None:
        """The next `count` /v1 requests send nothing for `seconds`."""
        with self.faults.lock:
            self.faults.first_byte_count = count
            self.faults.first_byte_delay = seconds

    def cut_stream(self, after_events: int = 2, count: int = 1) -> None:
        """The next `count` /v1 responses drop the connection after sending
        `after_events` body writes (SSE events for a stream)."""
        with self.faults.lock:
            self.faults.cut_count = count
            self.faults.cut_after_events = after_events

    def faults_at_random(
        self,
        seed: int | None = None,
        fail_rate: float = 0.0,
        fail_status: int = 500,
        slow_rate: float = 0.0,
        slow_seconds: float = 0.0,
        cut_rate: float = 0.0,
        cut_after_events: int = 2,
    ) -> None:
        """From now on each /v1 request fails (`fail_status`), sends nothing for
        `slow_seconds`, or is cut after `cut_after_events` body writes, each with
        its rate, drawn from a RNG seeded with `seed`. `faults.injected` counts
        what was dealt."""
        with self.faults.lock:
            self.faults.rng = random.Random(seed)
            self.faults.fail_rate, self.faults.fail_status = fail_rate, fail_status
            self.faults.slow_rate, self.faults.slow_seconds = slow_rate, slow_seconds
            self.faults.cut_rate, self.faults.cut_after_events = cut_rate, cut_after_events

    def set_healthy(self, healthy: bool) -> None:
        """`GET /health` answers 200 when healthy, else 503."""
        self.healthy = healthy

    # Metrics ---------------------------------------------------------------

    def record_spec_decode(
        self,
        num_drafts: int,
        num_draft_tokens: int,
        num_accepted_tokens: int,
        accepted_per_pos: tuple[int, ...] = (),
    ) -> None:
        """Add to the `vllm:spec_decode_*` counters (speculative fakes only)."""
        self.metrics.observe_spec_decode(
            num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos
        )

    def set_load(self, running: int | None = None, waiting: int | None = None) -> None:
        """Pin `vllm:num_requests_running` / `waiting`; `None` goes back to counting."""
        self.metrics.override_load(running=running, waiting=waiting)

    # Requests --------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received, oldest first (including /health and /metrics)."""
        return list(self._injector.requests)

    def completion_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.startswith("/v1/") and r.method == "POST"]


def _echo_request_id(app: ASGIApp, as_vllm: Callable[[], bool] = lambda: False) -> ASGIApp:
    """Every answer carries the `x-request-id` its request came with as
    `x-fake-request-id`, so a test can tell which request an answer belongs to;
    while `as_vllm()` holds, also as `x-request-id` (a fresh one if none came)."""

    async def echoing(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        echo = [(b"x-fake-request-id", v) for k, v in scope["headers"] if k.lower() == b"x-request-id"][:1]
        if as_vllm():
            echo.append((b"x-request-id", echo[0][1] if echo else uuid.uuid4().hex.encode()))

        async def send_with_echo(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *echo]}
            await send(message)

        await app(scope, receive, send_with_echo)

    return echoing
