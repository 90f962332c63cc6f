"""The generation routes (OpenAI's chat completions, completions and
Responses, Anthropic's Messages): parse -> route (gateway.decide) -> an
exchange for the relay (gateway.upstream). A Responses request that
continues a `previous_response_id` this gateway saw completed goes to the
pool and endpoint that hold it, and nowhere else (upstream/response_homes.py)."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from gateway.capture.stage import Capture
from gateway.decide.admission import hold
from gateway.decide.api_paths import PATHS
from gateway.decide.features import Limits, check_limits, parse_json
from gateway.decide.latency import LatencyModel
from gateway.decide.routing import Decision, Overrides, Routed, route
from gateway.decide.traffic import ClassLatency
from gateway.edge.auth import ClientKeys, Grant
from gateway.edge.body import read_body
from gateway.edge.load_view import DecisionLoad
from gateway.edge.preferred import PreferredPools
from gateway.edge.priority import request_priority
from gateway.edge.tracing import span_of, trace_decision
from gateway.errors import Forbidden, InvalidRequest, NoHealthyBackend, NotFound
from gateway.flags import FlagStore
from gateway.metrics import Children, GatewayMetrics
from gateway.policy.classes import traffic_class
from gateway.policy.features import Features
from gateway.settings import Settings
from gateway.telemetry.spans import NULL_SPAN
from gateway.upstream.exchange import Exchange, Outgoing, Recorder, Sink
from gateway.upstream.headers import request_headers
from gateway.upstream.prompt_key import PromptKey
from gateway.upstream.proxy import Forwarder
from gateway.upstream.queue_metrics import QueueMetrics
from gateway.upstream.relay import Relay, RelayTimeouts
from gateway.upstream.response_homes import Home, ResponseHomes
from gateway.upstream.runtime import Runtime
from gateway.upstream.upstream import Upstream
from gateway.upstream.usage import UsagePlan

PREVIOUS_RESPONSE = "previous_response"  # the rule name of a request sent where its previous response lives
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id(request: Request, rng: random.Random) -> str:
    """The client's x-request-id when it is sane, else a fresh random id. Ids
    need to be unique, not secret, so a seeded PRNG does (os.urandom per
    request is a system call on the hot path)."""
    given = request.headers.get("x-request-id", "")
    return given if given and REQUEST_ID.match(given) else f"{rng.getrandbits(128):032x}"


def id_of(request: Request) -> str:
    """The id the middleware gave the request. Read off the scope: Starlette's
    `request.state` builds a `State` around it on each read (60 bytecodes)."""
    found: str = request.scope["state"]["request_id"]
    return found


class ProxyEndpoints:
    def __init__(self, settings: Settings, runtime: Runtime, flags: FlagStore,
                 metrics: GatewayMetrics, keys: ClientKeys | None = None,
                 rng: random.Random | None = None, class_latency: ClassLatency | None = None,
                 latency: LatencyModel | None = None, capture: Capture | None = None,
                 observers: Sequence[Sink] = (), homes: ResponseHomes | None = None) -> None:
        self.settings = settings
        self.capture = capture  # offered each chat/completions request after routing
        self.class_latency = class_latency
        self.latency = latency  # read by `route: fastest`; None: its priors
        self.preferred = PreferredPools()  # each class's best pool by the mean, and its log line
        self.log = structlog.get_logger("specgate.routing")
        self.keys = keys or ClientKeys({})
        self.runtime = runtime
        self.load = DecisionLoad(runtime)
        self.flags = flags
        self.metrics = metrics
        self._decisions, self._predicted = Children(metrics.route_decisions), Children(metrics.predicted_e2e)
        self.rng = rng or random.Random()
        self.homes = homes or ResponseHomes()
        self.recorder = Recorder(metrics, runtime, class_latency, observers, self.homes)  # each answer's Measurement
        self.forwarder = Forwarder(on_error=self.recorder.error, on_retry=self.recorder.retry,
                                   waits=QueueMetrics(metrics.registry))

    def route(self, body: Mapping[str, Any], endpoint: str, headers: Mapping[str, str]) -> Routed:
        """The decision for a parsed body, without sending anything anywhere."""
        policy = self.runtime.policy
        routed = route(body, endpoint, policy, self.load(), self.flags.snapshot(),
                       Overrides.from_headers(headers, policy), self.rng.random(), self.latency, self.rng)
        home = self._home(endpoint, body)
        if home is None:
            return routed
        return Routed(routed.features, Decision(home.pool, PREVIOUS_RESPONSE, f"previous_response_id is held by "
                                                f"{home.endpoint} in pool '{home.pool}'", chain=(home.pool,),
                                                home=home.endpoint))

    async def chat(self, request: Request) -> ASGIApp:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> ASGIApp:
        return await self._generate(request, "completions")

    async def messages(self, request: Request) -> ASGIApp:
        return await self._generate(request, "messages")

    async def responses(self, request: Request) -> ASGIApp:
        return await self._generate(request, "responses")

    async def _generate(self, request: Request, endpoint: str) -> ASGIApp:
        grant = self._grant(request)
        raw = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s)
        parsed = parse_json(raw)
        body: dict[str, Any] = parsed.value
        routed = self.route(body, endpoint, request.headers)
        priority = request_priority(request.headers, grant, self.runtime.policy, routed.decision.rule)
        routed, held = await self._admitted(routed, body, endpoint, request.headers, priority)
        # Every latency of the exchange (TTFT, duration, what the latency model learns) runs from
        # here, the body complete and admitted: a slow upload is the client's own time, bounded by
        # body_timeout_s, and a hold at the gateway is not the pool's.
        started = time.perf_counter()
        decision, features = routed.decision, routed.features
        span = trace_decision(request, endpoint, body, routed)
        if held is not None:
            span.set({"specgate.admission.wait_s": held[0], "specgate.admission.outcome": held[1]})
        check_limits(body, Limits(n=self.settings.max_n, max_tokens=self._max_tokens(decision.pool)))
        self._count(decision, endpoint)
        traffic = self._traffic_class(features)
        if self.capture is not None and self.capture.spec.enabled:  # off (the default): not even a call
            self.capture.offer(endpoint, body, traffic)
        # No await from the decision to the lease: the next decision counts this one (see load_view).
        if decision.home is not None and grant is not None and not grant.allows(decision.pool):
            raise Forbidden(f"this API key may not use pool '{decision.pool}', which holds the previous response")
        chain, degraded = self._chain(decision.pool, grant, decision.chain)
        outgoing = Outgoing("POST", PATHS[endpoint], raw, self._forwarded(request), body=body, spans=parsed.spans,
                            stream=features.stream, drop_client_key=self.keys.enabled,
                            usage=UsagePlan(endpoint, body, features.stream, features.n),
                            key=PromptKey(body, endpoint, request.headers),
                            home=decision.home)
        return self._relay(Exchange(chain, outgoing, id_of(request), decision.rule, started,
                                    self.forwarder, self.recorder, degraded=degraded,
                                    traffic=traffic, measured=True, load=features.load, priority=priority,
                                    trace=span, fallback=decision.fallback))

    def admission(self, routed: Routed) -> dict[str, Any]:
        """Whether the decision would be held now, and how many are held (for explain)."""
        gate = self.runtime.gate
        found = routed.decision.fastest
        held = None if found is None else hold(found, self.runtime.policy.objectives, gate.ahead(0))
        return {"held_now": gate.held, "hold": None if held is None else held.to_json()}

    async def _admitted(self, routed: Routed, body: Mapping[str, Any], endpoint: str, headers: Mapping[str, str],
                        priority: int) -> tuple[Routed, tuple[float, str] | None]:
        """`routed`, or, while every candidate is past its room, the
        decision taken again each time a lease comes back (gateway/decide/admission.py);
        with how long it was held and how that ended, if it was."""
        gate, first, deadline = self.runtime.gate, None, 0.0
        rank = (0, 0.0, 0)
        while routed.decision.fastest is not None and self.latency is not None:
            held = hold(routed.decision.fastest, self.runtime.policy.objectives, gate.ahead(priority))
            now = time.perf_counter()
            if held is None or (first is not None and deadline <= now):
                break
            if first is None:
                first, rank, deadline = now, gate.rank(priority, now + held.objective_s), now + held.budget_s
            self.metrics.admission_held.inc()
            try:
                woke = await gate.wait(held.pools, rank, min(held.budget_s, deadline - now))
            finally:
                self.metrics.admission_held.dec()
            routed = self.route(body, endpoint, headers)
            if not woke:
                break
        waited = 0.0 if first is None else time.perf_counter() - first
        if routed.decision.fastest is not None and self.latency is not None and self.runtime.policy.objectives:
            self.latency.admitted(routed.decision.pool, waited)  # every request: its rooms count the wait
        if first is not None:
            outcome = "budget" if time.perf_counter() >= deadline else "released"
            self.metrics.admission_wait.observe(waited)
            self.metrics.admission_holds.labels(outcome).inc()
            self.log.info("admission_held", waited=round(waited, 4), outcome=outcome, pool=routed.decision.pool)
            return routed, (waited, outcome)
        return routed, None

    async def passthrough(self, request: Request) -> ASGIApp:
        """Any other /v1/* path goes to the policy's default pool as it is."""
        grant = self._grant(request)
        target = self._target(request)
        raw = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s)
        started = time.perf_counter()  # the body complete: as in _generate
        chain, degraded = self._chain(self.runtime.policy.default_pool, grant)
        _check_sendable(target, chain)
        priority = request_priority(request.headers, grant, self.runtime.policy, None)
        outgoing = Outgoing(request.method, target, raw, self._forwarded(request),
                            drop_client_key=self.keys.enabled)
        return self._relay(Exchange(chain, outgoing, id_of(request), "passthrough", started,
                                    self.forwarder, self.recorder, degraded=degraded, priority=priority,
                                    trace=span_of(request)))

    async def models(self, request: Request) -> Response:
        """The union of the models the pools' backends serve."""
        self._grant(request)
        seen: dict[str, dict[str, Any]] = {}
        for upstream in self.runtime.upstreams.values():
            for model in await _pool_models(upstream):
                seen.setdefault(model["id"], model)
        if not seen:
            raise NoHealthyBackend("no backend answered /v1/models")
        return JSONResponse({"object": "list", "data": list(seen.values())})

    def _home(self, endpoint: str, body: Mapping[str, Any]) -> Home | None:
        """Where the response a Responses request continues lives, when this
        gateway saw it complete; a 404 when that endpoint left the policy
        (the conversation cannot continue anywhere else)."""
        previous = body.get("previous_response_id") if endpoint == "responses" else None
        if previous is None:
            return None
        if not isinstance(previous, str):
            raise InvalidRequest("'previous_response_id' must be a string", param="previous_response_id")
        home = self.homes.find(previous)
        if home is None:
            return None
        pool = self.runtime.pools.get(home.pool)
        if pool is None or all(e.url != home.endpoint for e in pool.endpoints):
            raise NotFound(f"response '{previous}' was held by {home.endpoint} in pool '{home.pool}', which "
                           "the policy no longer has", param="previous_response_id",
                           code="previous_response_not_found")
        return home

    def _grant(self, request: Request) -> Grant | None:
        if not self.keys.enabled:
            return None
        return self.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))

    def _count(self, decision: Decision, api: str) -> None:
        """The decision's metrics, and its class's preferred pool (a log line when that changes)."""
        self._decisions(decision.pool, decision.rule, "true" if decision.explored else "false", api).inc()
        found = decision.fastest
        if found is None:
            return
        self._predicted(found.pool).observe(found.chosen.predicted.e2e_s)
        self.preferred.note(decision.rule, found)

    def _chain(self, name: str, grant: Grant | None = None, order: Sequence[str] = ()) -> tuple[list[Upstream], bool]:
        """`order`, else `name` and its fallback chain: the pools in the order they are
        tried. A key limited to some pools only ever reaches those. Degraded (each
        pool's least-bad endpoint will do) when no pool of the chain has an endpoint available."""
        names: Sequence[str] = order or self.runtime.policy.fallback_chains[name]
        if grant is not None:
            names = [n for n in names if grant.allows(n)] or [n for n in self.runtime.pools if grant.allows(n)]
            if not names:
                raise Forbidden("this API key may not use any pool of the policy")
        chain = self.runtime.chain(names)
        return chain, not any(upstream.pool.has_available() for upstream in chain)

    def _max_tokens(self, pool: str) -> int:
        """The most output tokens a request may ask of `pool`: its context length
        when the policy gives it."""
        return self.runtime.pools[pool].max_model_len or self.settings.max_output_tokens

    @staticmethod
    def _target(request: Request) -> str:
        """The path and query to send on, as the edge passed them (checked and
        normalised there): no control character or raw non-ASCII byte, no over-long
        target."""
        scope = request.scope
        raw = scope.get("raw_path") or quote(scope["path"]).encode()
        query = scope.get("query_string", b"")
        return (raw + b"?" + query if query else raw).decode("latin-1")

    @staticmethod
    def _forwarded(request: Request) -> list[tuple[str, str]]:
        """The client's headers for the backends, checked (a bad one is a 400
        before anything is leased), less hop-by-hop ones; the trace context is the gateway's span's."""
        headers, span = request_headers(request.headers.items(), {"x-request-id": id_of(request)}), span_of(request)
        return headers if span is NULL_SPAN else span.propagate(headers)  # tracing off: no context to put in

    def _relay(self, exchange: Exchange) -> Relay:
        return Relay(exchange, RelayTimeouts.for_chain(exchange.chain, self.settings.keepalive_s,
                                                       self.settings.write_timeout_s))

    def _traffic_class(self, features: Features) -> str | None:
        """The class the answer's measurement is kept under; None for a domain
        the policy does not define."""
        spec = self.runtime.policy.spec
        if features.domain != spec.default_domain and features.domain not in spec.domains:
            return None  # an x-specgate-domain header value: unbounded, not kept
        return traffic_class(features.domain, features.temperature)


async def _pool_models(upstream: Upstream) -> list[dict[str, Any]]:
    pool = upstream.pool
    for endpoint in pool.endpoints:
        try:
            response = await upstream.client.get(endpoint.url + "/v1/models", timeout=pool.spec.timeouts.connect_s)
            data = response.json().get("data", []) if response.status_code == 200 else []
            return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
    return []


def _check_sendable(path: str, chain: list[Upstream]) -> None:
    """A path httpx will not send (over its URL length limit, a character it
    refuses) is a 400 before anything is leased. One parse, on the longest URL."""
    longest = max((e for upstream in chain for e in upstream.pool.endpoints), key=lambda e: len(e.url))
    try:
        longest.target_for(path)
    except httpx.InvalidURL as exc:
        raise InvalidRequest(f"the request path cannot be forwarded: {exc}", param="path") from None
