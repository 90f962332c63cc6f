"""One request's exchange with the upstreams, from the first lease to the log line.

The edge builds an `Exchange` from plain data (the chain to try, the request
to send, its id, rule, dispatch time (its body complete), traffic class and the pools' load when
it was routed); the relay calls
`open()`, relays the answer, and calls `finish(outcome)` once. The exchange
owns the request's `Claim` (its lease and response), measures a generation's
answer in output tokens (a `Measurement`), and reports everything through a
`Recorder`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import structlog

from gateway.decide.json_body import Spans, dumps_with
from gateway.decide.traffic import ClassLatency
from gateway.errors import DeadlineExceeded, GatewayError
from gateway.metrics import Children, GatewayMetrics
from gateway.telemetry.spans import NULL_SPAN, RequestSpan
from gateway.upstream.claim import Claim
from gateway.upstream.drafting import Drafting
from gateway.upstream.meter import Measurement, TokenMeter
from gateway.upstream.pools import Lease, Pool
from gateway.upstream.prompt_key import PromptKey
from gateway.upstream.proxy import Forwarder, Opened, Outbound, Standing
from gateway.upstream.response_homes import ResponseHomes
from gateway.upstream.runtime import Runtime
from gateway.upstream.upstream import Upstream
from gateway.upstream.usage import UsagePlan, UsageTap, response_id

CLIENT_KEY_HEADERS = frozenset({"authorization", "x-api-key"})
SSE = "text/event-stream"
Sink = Callable[[Measurement], None]
PASSTHROUGH = UsagePlan("passthrough")  # what a request that is not a generation asks of usage: nothing (immutable)


class Outgoing:
    """The request as the client made it, checked: what each pool is sent. A plain class, built
    per request: mypyc compiles the `__init__` written out, where a named tuple's `__new__` runs
    interpreted. Read-only by convention."""

    def __init__(self, method: str, path: str, content: bytes, headers: list[tuple[str, str]],
                 body: dict[str, Any] | None = None, spans: Spans | None = None, stream: bool = False,
                 drop_client_key: bool = False, usage: UsagePlan = PASSTHROUGH, key: PromptKey | None = None,
                 home: str | None = None) -> None:
        self.method = method
        self.path = path  # path and query, as the edge normalised them
        self.content = content
        self.headers = headers  # the client's, checked, less hop-by-hop ones
        self.body = body  # the parsed JSON body, whose model a pool may rename
        self.spans = spans  # where body's values lie in the text it was parsed from (decide/json_body.py)
        self.stream = stream
        self.drop_client_key = drop_client_key  # the gateway checks keys: the client's own is never sent on
        self.usage = usage  # asked, read, removed
        self.key = key  # the prompt's block hashes and session, for the pools' balancers
        self.home = home  # the only endpoint (its URL) that may serve it: it holds the previous response

    def to(self, pool: Pool, started: float) -> Outbound:
        content = self.content
        if self.body is not None:
            changes: dict[str, Any] = {}
            if pool.model and self.body.get("model") != pool.model:
                changes["model"] = pool.model
            changes.update(self.usage.asks(self.body, pool.paces(self.body, self.stream)))
            if changes:
                content = dumps_with(self.body, changes, self.spans)
        timeouts = pool.timeouts
        # total_s counts from the body's completion (`started`) and covers the whole answer
        deadline = asyncio.get_running_loop().time() + timeouts.total_s - (time.perf_counter() - started)
        header_timeout = timeouts.first_byte_s if self.stream else timeouts.total_s
        return Outbound(self.path, self._headers_for(pool), content, header_timeout, deadline, self.method,
                        self.key, self.home, timeouts.idle_s if self.stream else None)

    def _headers_for(self, pool: Pool) -> list[tuple[str, str]]:
        """The client's key is never sent on when the gateway checks keys or the
        pool has its own."""
        key = pool.upstream_api_key()
        if key is None and not self.drop_client_key:
            return self.headers
        kept = [(k, v) for k, v in self.headers if k.lower() not in CLIENT_KEY_HEADERS]
        return kept if key is None else [*kept, ("authorization", f"Bearer {key}")]


class Outcome:
    """How a relay ended (a plain class, as `Exchange` is)."""

    def __init__(self, status: int) -> None:
        self.status = status  # what the books say: the upstream status, 499, or the error's status
        self.ok = False  # the upstream answer reached the client whole
        self.delivered = False  # the stream's [DONE] event went out: the client may leave now
        self.stalled = False  # the client stopped reading and was cut
        self.judged = False  # the relay ended in a known way: the outcome may speak of the endpoint
        self.left = False  # the client went away or stopped reading before the answer ended
        self.fault = "stream_broken"  # how the answer broke, when it did: stream_broken, first_byte, idle
        self.opened: Opened | None = None
        self.error: GatewayError | None = None

    def verdict(self) -> bool | None:
        """What the exchange says of its endpoint: None when the answer never
        began (the request never went out whole), when the request's own
        deadline or its client ended it (its outcome, not the endpoint's), or
        when something unforeseen raised through the relay."""
        if self.opened is None or not self.judged or self.left or isinstance(self.error, DeadlineExceeded):
            return None
        # a 5xx answer is a failure of the endpoint even when it reached the client whole
        return self.error is None and self.status < 500

    def why(self) -> str:
        """The endpoint's fault, for the ejection log, when the verdict is False."""
        return self.fault if self.error is not None else f"status_{self.status}"


class Recorder:
    """Where exchanges leave their numbers: the metrics, the request log, and
    each answered generation's `Measurement`, handed to every sink (the time
    per output token by traffic class, for the guard, is one)."""

    def __init__(self, metrics: GatewayMetrics, runtime: Runtime,
                 class_latency: ClassLatency | None = None, sinks: Sequence[Sink] = (),
                 homes: ResponseHomes | None = None) -> None:
        self.metrics = metrics
        self.runtime = runtime
        self.homes = homes  # where each completed Responses answer lives
        self.class_latency = class_latency
        self.sinks: list[Sink] = [*([] if class_latency is None else [self._class_timing]), *sinks]
        # bound now, not on each line through structlog's lazy proxy (two interpreted frames a
        # request): the app is built after `configure_logging`, whose loggers are cached on first use
        self.log = structlog.get_logger("specgate.request").bind()
        self._requests, self._duration = Children(metrics.requests), Children(metrics.duration)
        self._ttfb, self._in_flight = Children(metrics.ttfb), Children(metrics.in_flight)

    def overhead(self, seconds: float) -> None:
        self.metrics.overhead.observe(seconds)

    def answered(self, pool: Pool, rule: str, status: int, duration_s: float, ttfb_s: float | None,
                 api: str) -> None:
        self._requests(pool.name, rule, str(status), api).inc()
        self._duration(pool.name).observe(duration_s)
        if ttfb_s is not None:
            self._ttfb(pool.name).observe(ttfb_s)

    def lease(self, pool: Pool, delta: int) -> None:
        self._in_flight(pool.name).inc(delta)

    def error(self, pool: Pool, kind: str) -> None:
        self.metrics.upstream_errors.labels(pool.name, kind).inc()

    def retry(self, pool: Pool) -> None:
        self.metrics.retries.labels(pool.name).inc()

    def measured(self, measurement: Measurement) -> None:
        for sink in self.sinks:
            sink(measurement)

    def _class_timing(self, measurement: Measurement) -> None:
        """While the guard compares classes, and only for pools of the current
        policy (a retired pool's windows would never be read)."""
        seconds, traffic = measurement.tpot_s, measurement.traffic_class
        if (seconds is None or traffic is None or self.class_latency is None
                or not self.runtime.policy.spec.guard.classes.enabled or measurement.pool not in self.runtime.pools):
            return
        self.class_latency.record(traffic, measurement.pool, seconds)


class Exchange:
    """One request's way through its pools: opened, relayed, and put in the books.

    A plain class with its `__init__` written out, as the other objects built per
    request are: mypyc compiles what the source says, while a dataclass's generated
    `__init__` would run interpreted."""

    def __init__(self, chain: Sequence[Upstream], request: Outgoing, request_id: str, rule: str, started: float,
                 forwarder: Forwarder, recorder: Recorder, degraded: bool = False, traffic: str | None = None,
                 measured: bool = False, load: Mapping[str, int] | None = None, priority: int = 0,
                 fallback: str | None = None, trace: RequestSpan = NULL_SPAN) -> None:
        self.chain = chain  # the routed pool, then its fallbacks, in the order tried
        self.request = request
        self.request_id = request_id
        self.rule = rule
        self.started = started  # perf_counter() when the request's body was complete: every latency runs from here
        self.forwarder = forwarder
        self.recorder = recorder
        self.degraded = degraded  # no pool of the chain has an endpoint available: least-bad will do
        self.traffic = traffic  # the class the answer's measurement is kept under
        self.measured = measured  # a generation: its answer is measured in output tokens
        self.load: Mapping[str, int] = {} if load is None else load  # each pool's load when the request was routed
        self.priority = priority  # its place while pools are saturated (docs/priorities.md)
        self.fallback = fallback  # why routing already left the rule's pool (`flag`), before any try
        self.trace = trace  # the request's span (docs/tracing.md)
        self.claim = Claim(recorder.lease)
        self.claim.fallback = fallback  # the routing's own reason comes first
        self.meter: TokenMeter | None = None
        self.tap: UsageTap | None = None  # a streamed answer's events pass through it
        self.body_tokens: int | None = None
        self.body_drafting: Drafting | None = None
        self.response_id: str | None = None  # a whole Responses answer's id

    async def open(self) -> Opened:
        """The backend's answer, headers in, leased through the claim."""
        self.recorder.overhead(time.perf_counter() - self.started)
        opened = await self.forwarder.open_first(self.chain, self._outbound, self.claim, self.degraded,
                                                 Standing(self.priority, self.load))
        if self.trace.recording and isinstance(opened.response.stream, httpx.AsyncByteStream):
            opened.response.stream = self.trace.watch(opened.response.stream)  # before the meter: the raw answer
        stream = opened.response.stream
        if (self.measured and isinstance(stream, httpx.AsyncByteStream)
                and opened.response.headers.get("content-type", "").startswith(SSE)):
            opened.response.stream = self.meter = TokenMeter(stream, mark=self.request.usage.mark)
            self.tap = self.request.usage.tap()
        return opened

    def read_body(self, content: bytes) -> None:
        """A whole answer's body, as the relay read it: its usage block counts the tokens."""
        if self.measured:
            self.body_tokens = self.request.usage.body_tokens(content)
            self.body_drafting = Drafting.reported(content)
            if self.request.usage.endpoint == "responses":
                self.response_id = response_id(content)

    def headers(self) -> dict[str, str]:
        """The gateway's own response headers: they name the pool the claim ended on."""
        served = self.claim.pool or self.chain[0].pool
        extra = {"x-specgate-pool": served.name, "x-specgate-rule": self.rule, "x-request-id": self.request_id}
        if self.claim.fallback is not None:
            extra["x-specgate-reason"] = f"fallback:{self.claim.fallback}"
        return extra

    async def finish(self, outcome: Outcome) -> None:
        """Give the claim back and record the exchange; once, whatever happened."""
        held = self.claim.lease  # an answer that never began still went to this endpoint
        try:
            await self.claim.give_back(outcome.verdict(), outcome.why())
        finally:
            self._record(outcome, held)

    def _outbound(self, pool: Pool) -> Outbound:
        return self.request.to(pool, self.started)

    def _record(self, outcome: Outcome, held: Lease | None) -> None:
        duration = time.perf_counter() - self.started
        pool = self.claim.pool or self.chain[0].pool
        opened = outcome.opened
        api = self.request.usage.endpoint
        self.recorder.answered(pool, self.rule, outcome.status, duration, None if opened is None else opened.ttfb_s,
                               api)
        fields: dict[str, Any] = {"request_id": self.request_id, "api": api, "pool": pool.name, "rule": self.rule,
                                  "status": outcome.status, "duration": round(duration, 6)}
        if self.claim.fallback is not None:
            fields["fallback"] = self.claim.fallback
        measurement = None
        lease = held if opened is None else opened.lease
        if lease is not None:
            fields.update(endpoint=lease.endpoint.url, endpoint_why=lease.why, matched_blocks=lease.matched)
        if opened is not None:
            if outcome.error is not None:
                self.recorder.error(pool, "deadline" if isinstance(outcome.error, DeadlineExceeded) else "stream_cut")
            fields["ttfb"] = round(opened.ttfb_s, 6)
            measurement = (self._measurement(pool, duration, opened.lease.mean_load)
                           if outcome.ok and opened.response.is_success else None)
            if measurement is not None:
                fields["tokens"] = measurement.tokens
                self.recorder.measured(measurement)
                self._remember_home(pool, opened.lease.endpoint.url, fields)
        if outcome.error is not None:
            fields["error"] = outcome.error.code or outcome.error.error_type
        elif outcome.stalled:
            fields["error"] = "client_stalled"
        self.recorder.log.info("request", **fields)
        if self.trace.recording:
            self._trace(outcome, fields, measurement)

    def _trace(self, outcome: Outcome, fields: Mapping[str, Any], measurement: Measurement | None) -> None:
        """What the exchange adds to the request's span: where it was served, how long it waited and took."""
        self.trace.set({
            "specgate.served_pool": fields["pool"], "specgate.fallback": fields.get("fallback"),
            "specgate.endpoint": fields.get("endpoint"), "specgate.endpoint_why": fields.get("endpoint_why"),
            "specgate.queue_wait_s": self.claim.waited_s, "specgate.ttfb_s": fields.get("ttfb"),
            "specgate.status": outcome.status,
            "specgate.measured.ttft_s": None if measurement is None else measurement.ttft_s,
            "specgate.measured.tpot_s": None if measurement is None else measurement.tpot_s,
            "specgate.measured.e2e_s": None if measurement is None else measurement.e2e_s,
        })
        error = outcome.error
        if error is not None and error.status_code >= 500:  # a 4xx is the client's: no error status
            self.trace.fail(error.code or error.error_type, error.message)
        elif error is not None:
            self.trace.set({"error.type": error.code or error.error_type})

    def _remember_home(self, pool: Pool, endpoint: str, fields: dict[str, Any]) -> None:
        """A completed Responses answer: where its follow-ups must go."""
        found = self.response_id if self.tap is None else self.tap.response_id
        if found is not None and self.recorder.homes is not None:
            self.recorder.homes.remember(found, pool.name, endpoint)
            fields["response_id"] = found

    def _measurement(self, pool: Pool, duration: float, batch: float | None) -> Measurement | None:
        """What the answer tells of `pool`; None when it was not measured. `batch`: the pool's
        mean in flight while the answer's lease was held."""
        load = self.load.get(pool.name, 0)
        if self.meter is not None and self.meter.events:
            usage = None if self.tap is None else self.tap.tokens()
            tokens = self.meter.tokens() if usage is None else usage  # a pool that sent no usage: its events
            return Measurement.of_stream(pool.name, self.traffic, load, self.meter, self.started, tokens,
                                         steps_are_events=self.request.usage.endpoint in ("chat", "completions"),
                                         batch=batch)
        if self.body_tokens is None:
            return None
        return Measurement(pool.name, self.traffic, load, duration, self.body_tokens, streamed=False,
                           drafting=self.body_drafting, batch=batch)
