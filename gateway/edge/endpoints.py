"""The OpenAI-facing routes: parse -> classify -> route -> pick -> proxy -> record."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from gateway.decide.features import Features, Limits, check_limits, extract_features, parse_json_body
from gateway.decide.routing import Decision, decide
from gateway.decide.traffic import ClassLatency, TokenMeter, traffic_class
from gateway.edge.auth import ClientKeys, Grant
from gateway.errors import Forbidden, InvalidRequest, NoHealthyBackend, PayloadTooLarge, RequestTimeout
from gateway.flags import FlagStore
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.upstream.pools import Pool
from gateway.upstream.proxy import Claim, Forwarder, Opened, Outbound, request_headers
from gateway.upstream.relay import Exchange, Outcome, RelayTimeouts
from gateway.upstream.runtime import Runtime

CLIENT_KEY_HEADERS = frozenset({"authorization", "x-api-key"})
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id(request: Request, rng: random.Random) -> str:
    """The client's x-request-id when it is sane, else a fresh random id. Ids
    need to be unique, not secret, so a seeded PRNG does (os.urandom per
    request is a system call on the hot path)."""
    given = request.headers.get("x-request-id", "")
    return given if REQUEST_ID.match(given) else f"{rng.getrandbits(128):032x}"


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The body, at most `limit` bytes, all of it within `timeout_s` (a client
    that stalls or trickles must not hold a connection and a task forever)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is over the {limit} byte limit")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise PayloadTooLarge(f"request body is over the {limit} byte limit")
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None
    return bytes(body)


@dataclass
class Routed:
    features: Features
    decision: Decision
    body: dict[str, Any]


class ProxyEndpoints:
    def __init__(self, settings: Settings, runtime: Runtime, flags: FlagStore,
                 metrics: GatewayMetrics, keys: ClientKeys | None = None,
                 rng: random.Random | None = None, class_latency: ClassLatency | None = None) -> None:
        self.settings = settings
        self.class_latency = class_latency
        self.keys = keys or ClientKeys({})
        self.runtime = runtime
        self.flags = flags
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.log = structlog.get_logger("specgate.request")
        self.forwarder = Forwarder(runtime.transport_for, runtime.budget_for,
                                   on_error=self._count_error, on_retry=self._count_retry)

    def route(self, body: Mapping[str, Any], endpoint: str, headers: Mapping[str, str]) -> Routed:
        """The decision for a parsed body, without sending anything anywhere."""
        policy = self.runtime.policy
        overrides = policy.spec.overrides
        domain = headers.get("x-specgate-domain") if overrides.domain_header else None
        route = headers.get("x-specgate-route") if overrides.route_header else None
        if route is not None and route not in policy.pools:
            raise InvalidRequest(f"x-specgate-route names unknown pool '{route}'", param="x-specgate-route")
        features = extract_features(body, endpoint, policy.defaults, policy.classifier,
                                    self.runtime.load(), domain_override=domain, route_override=route)
        decision = decide(features, policy, self.flags.snapshot(), self.rng.random())
        return Routed(features, decision, dict(body))

    async def chat(self, request: Request) -> ASGIApp:
        return await self._generate(request, "chat", "/v1/chat/completions")

    async def completions(self, request: Request) -> ASGIApp:
        return await self._generate(request, "completions", "/v1/completions")

    async def _generate(self, request: Request, endpoint: str, path: str) -> ASGIApp:
        started = time.perf_counter()
        grant = self._grant(request)
        raw = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s)
        routed = self.route(parse_json_body(raw), endpoint, request.headers)
        decided = routed.decision.pool
        check_limits(routed.body, Limits(n=self.settings.max_n, max_tokens=self._max_tokens(decided)))
        chain, degraded = self._chain(decided, grant)
        return self._exchange(request, chain, degraded, routed.decision.rule, path, raw, started,
                              body=routed.body, stream=routed.features.stream,
                              traffic=self._traffic_class(routed.features))

    async def passthrough(self, request: Request) -> ASGIApp:
        """Any other /v1/* path goes to the policy's default pool as it is."""
        started = time.perf_counter()
        grant = self._grant(request)
        target = self._target(request)
        raw = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s)
        chain, degraded = self._chain(self.runtime.policy.default_pool, grant)
        _check_sendable(target, chain)
        return self._exchange(request, chain, degraded, "passthrough", target, raw, started,
                              method=request.method)

    async def models(self, request: Request) -> Response:
        """The union of the models the pools' backends serve."""
        self._grant(request)
        seen: dict[str, dict[str, Any]] = {}
        for pool in self.runtime.pools.values():
            for model in await self._pool_models(pool):
                seen.setdefault(model["id"], model)
        if not seen:
            raise NoHealthyBackend("no backend answered /v1/models")
        return JSONResponse({"object": "list", "data": list(seen.values())})

    async def _pool_models(self, pool: Pool) -> list[dict[str, Any]]:
        client = self.runtime.client_for(pool)
        for endpoint in pool.endpoints:
            try:
                response = await client.get(endpoint.url + "/v1/models", timeout=pool.spec.timeouts.connect_s)
                data = response.json().get("data", []) if response.status_code == 200 else []
                return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
        return []

    def _grant(self, request: Request) -> Grant | None:
        if not self.keys.enabled:
            return None
        return self.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))

    def _chain(self, name: str, grant: Grant | None = None) -> tuple[list[Pool], bool]:
        """`name` and its fallback chain, in the order they are tried. A key limited
        to some pools only ever reaches those. Degraded (each pool's least-bad
        endpoint will do) when no pool of the chain has an endpoint available."""
        pools = self.runtime.pools
        names = self.runtime.policy.fallback_chain(name)
        if grant is not None:
            names = [n for n in names if grant.allows(n)] or [n for n in pools if grant.allows(n)]
            if not names:
                raise Forbidden("this API key may not use any pool of the policy")
        chain = [pools[n] for n in names]
        return chain, not any(pool.has_available() for pool in chain)

    def _max_tokens(self, pool: str) -> int:
        """The most output tokens a request may ask of `pool`: its context length
        when the policy gives it."""
        return self.runtime.policy.pools[pool].max_model_len or self.settings.max_output_tokens

    @staticmethod
    def _target(request: Request) -> str:
        """The path and query to send on, as the edge passed them (checked and
        normalised there): no control character or raw non-ASCII byte, no over-long
        target."""
        scope = request.scope
        raw = scope.get("raw_path") or quote(scope["path"]).encode()
        query = scope.get("query_string", b"")
        return (raw + b"?" + query if query else raw).decode("latin-1")

    def _upstream_headers(self, forwarded: list[tuple[str, str]], pool: Pool) -> list[tuple[str, str]]:
        """`forwarded` (the client's headers, checked, less hop-by-hop ones) for
        `pool`: the client's own key is never sent on when the gateway checks keys
        or the pool has its own."""
        key = pool.spec.upstream_api_key()
        if key is None and not self.keys.enabled:
            return forwarded
        kept = [(k, v) for k, v in forwarded if k.lower() not in CLIENT_KEY_HEADERS]
        return kept if key is None else [*kept, ("authorization", f"Bearer {key}")]

    def _exchange(self, request: Request, chain: list[Pool], degraded: bool, rule: str, path: str,
                  raw: bytes, started: float, *, body: dict[str, Any] | None = None, stream: bool = False,
                  method: str = "POST", traffic: str | None = None) -> Exchange:
        """The exchange that sends the request down `chain`; every header is checked
        (and a bad one answered 400) before anything is leased."""
        rid = request.state.request_id
        forwarded = request_headers(request.headers.items(), {"x-request-id": rid})

        def outbound(pool: Pool) -> Outbound:
            content = raw
            if body is not None and pool.spec.model and body.get("model") != pool.spec.model:
                content = json.dumps({**body, "model": pool.spec.model}, separators=(",", ":")).encode()
            timeouts = pool.spec.timeouts
            # total_s counts from the request's arrival and covers the whole answer
            deadline = asyncio.get_running_loop().time() + timeouts.total_s - (time.perf_counter() - started)
            header_timeout = timeouts.first_byte_s if stream else timeouts.total_s
            return Outbound(path, self._upstream_headers(forwarded, pool), content, header_timeout, deadline,
                            method)

        def open_upstream(claim: Claim) -> Awaitable[Opened]:
            self.metrics.overhead.observe(time.perf_counter() - started)
            opening = self.forwarder.open_first(chain, outbound, claim, degraded)
            return opening if traffic is None else _metered(opening)

        def gateway_headers(claim: Claim) -> dict[str, str]:
            served = claim.pool or chain[0]
            extra = {"x-specgate-pool": served.name, "x-specgate-rule": rule, "x-request-id": rid}
            if claim.fallback is not None:
                extra["x-specgate-reason"] = f"fallback:{claim.fallback}"
            return extra

        def finish(outcome: Outcome) -> None:
            duration = time.perf_counter() - started
            pool = outcome.claim.pool or chain[0]
            self.metrics.requests.labels(pool.name, rule, str(outcome.status)).inc()
            self.metrics.duration.labels(pool.name).observe(duration)
            fields: dict[str, Any] = {"request_id": rid, "pool": pool.name, "rule": rule,
                                      "status": outcome.status, "duration": round(duration, 6)}
            if outcome.claim.fallback is not None:
                fields["fallback"] = outcome.claim.fallback
            opened = outcome.opened
            if opened is not None:
                if outcome.error is not None:
                    self._count_error(pool, "stream_cut")
                self.metrics.ttfb.labels(pool.name).observe(opened.ttfb_s)
                fields.update(endpoint=opened.lease.endpoint.url, ttfb=round(opened.ttfb_s, 6))
                if traffic is not None and outcome.ok and isinstance(opened.response.stream, TokenMeter):
                    self._record_tpot(traffic, pool, opened.response.stream)
            if outcome.error is not None:
                fields["error"] = outcome.error.code or outcome.error.error_type
            elif outcome.stalled:
                fields["error"] = "client_stalled"
            self.log.info("request", **fields)

        # a client that stops reading is cut within the shortest total_s of the chain at most
        write_s = min(self.settings.write_timeout_s, *(pool.spec.timeouts.total_s for pool in chain))
        relay_timeouts = RelayTimeouts(first_chunk_s=chain[0].spec.timeouts.first_byte_s,
                                       keepalive_s=self.settings.keepalive_s, write_s=write_s)
        return Exchange(open_upstream, gateway_headers, relay_timeouts, finish, Claim(self._count_lease))

    def _traffic_class(self, features: Features) -> str | None:
        """The class a streamed answer's token timing is kept under; None when
        not measured (no stream, or a domain the policy does not define)."""
        spec = self.runtime.policy.spec
        if self.class_latency is None or not features.stream or not spec.guard.classes.enabled:
            return None
        if features.domain != spec.default_domain and features.domain not in spec.domains:
            return None  # an x-specgate-domain header value: unbounded, not kept
        return traffic_class(features.domain, features.temperature)

    def _record_tpot(self, traffic: str, pool: Pool, meter: TokenMeter) -> None:
        seconds = meter.time_per_token()
        if seconds is not None and self.class_latency is not None and pool.name in self.runtime.pools:
            self.class_latency.record(traffic, pool.name, seconds)

    def _count_lease(self, pool: Pool, delta: int) -> None:
        self.metrics.in_flight.labels(pool.name).inc(delta)

    def _count_error(self, pool: Pool, kind: str) -> None:
        self.metrics.upstream_errors.labels(pool.name, kind).inc()

    def _count_retry(self, pool: Pool) -> None:
        self.metrics.retries.labels(pool.name).inc()


def _check_sendable(path: str, chain: list[Pool]) -> None:
    """A path httpx will not send (over its URL length limit, a character it
    refuses) is a 400 before anything is leased. One parse, on the longest URL."""
    longest = max((e for pool in chain for e in pool.endpoints), key=lambda e: len(e.url))
    try:
        longest.url_for(path)
    except httpx.InvalidURL as exc:
        raise InvalidRequest(f"the request path cannot be forwarded: {exc}", param="path") from None


async def _metered(opening: Awaitable[Opened]) -> Opened:
    """Count a streamed answer's events on their way through (see traffic.TokenMeter)."""
    opened = await opening
    if opened.response.headers.get("content-type", "").startswith("text/event-stream"):
        opened.response.stream = TokenMeter(opened.response.stream)
    return opened
