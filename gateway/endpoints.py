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

import httpx
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from gateway.auth import ClientKeys, Grant
from gateway.errors import Forbidden, InvalidRequest, NoHealthyBackend, PayloadTooLarge, RequestTimeout
from gateway.features import Features, extract_features, parse_json_body
from gateway.flags import FlagStore
from gateway.metrics import GatewayMetrics
from gateway.pools import Pool
from gateway.proxy import Forwarder, Opened, request_headers
from gateway.relay import Exchange, Outcome, RelayTimeouts
from gateway.routing import Decision, decide
from gateway.runtime import Runtime
from gateway.settings import Settings
from gateway.traffic import ClassLatency, TokenMeter, traffic_class

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
        pool, degraded = self._pool_for(routed.decision.pool, grant)
        body = routed.body
        if pool.spec.model and body.get("model") != pool.spec.model:
            body["model"] = pool.spec.model
            raw = json.dumps(body, separators=(",", ":")).encode()
        timeouts = pool.spec.timeouts
        header_timeout = timeouts.first_byte_s if routed.features.stream else timeouts.total_s
        return self._exchange(request, pool, routed.decision.rule, path, raw, header_timeout, degraded,
                              started, traffic=self._traffic_class(routed.features))

    async def passthrough(self, request: Request) -> ASGIApp:
        """Any other /v1/* path goes to the policy's default pool as it is."""
        started = time.perf_counter()
        grant = self._grant(request)
        raw = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s)
        pool, degraded = self._pool_for(self.runtime.policy.default_pool, grant)
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return self._exchange(request, pool, "passthrough", path, raw, pool.spec.timeouts.total_s,
                              degraded, started, method=request.method)

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

    def _pool_for(self, name: str, grant: Grant | None = None) -> tuple[Pool, bool]:
        """The pool to send to: `name`, else the first of its fallback chain with an
        endpoint available; when none has one, the first in degraded mode. A key
        limited to some pools only ever reaches those."""
        pools = self.runtime.pools
        chain = [name]
        while (fallback := pools[chain[-1]].spec.fallback) is not None and fallback not in chain:
            chain.append(fallback)
        if grant is not None:
            chain = [n for n in chain if grant.allows(n)] or [n for n in pools if grant.allows(n)]
            if not chain:
                raise Forbidden("this API key may not use any pool of the policy")
        for candidate in chain:
            if pools[candidate].has_available():
                return pools[candidate], False
        return pools[chain[0]], True

    def _upstream_headers(self, request: Request, pool: Pool, rid: str) -> list[tuple[str, str]]:
        """The client's headers minus hop-by-hop ones; the client's own key is
        never forwarded when the gateway checks keys or the pool has its own."""
        extra = {"x-request-id": rid}
        key = pool.spec.upstream_api_key()
        if key is not None:
            extra["authorization"] = f"Bearer {key}"
        drop = CLIENT_KEY_HEADERS if self.keys.enabled or key is not None else frozenset()
        return request_headers(request.headers.items(), extra, drop)

    def _exchange(self, request: Request, pool: Pool, rule: str, path: str, raw: bytes,
                  header_timeout_s: float, degraded: bool, started: float, method: str = "POST",
                  traffic: str | None = None) -> Exchange:
        rid = request.state.request_id
        headers = self._upstream_headers(request, pool, rid)
        in_flight = self.metrics.in_flight.labels(pool.name)

        def open_upstream() -> Awaitable[Opened]:
            in_flight.inc()
            spent = time.perf_counter() - started
            self.metrics.overhead.observe(spent)
            # total_s counts from the request's arrival and covers the whole answer
            deadline = asyncio.get_running_loop().time() + pool.spec.timeouts.total_s - spent
            opening = self.forwarder.open(pool, path, headers, raw, method=method, deadline=deadline,
                                          header_timeout_s=header_timeout_s, degraded=degraded)
            return opening if traffic is None else _metered(opening)

        def finish(outcome: Outcome) -> None:
            duration = time.perf_counter() - started
            if outcome.started:
                in_flight.dec()
            self.metrics.requests.labels(pool.name, rule, str(outcome.status)).inc()
            self.metrics.duration.labels(pool.name).observe(duration)
            fields = {"request_id": rid, "pool": pool.name, "rule": rule, "status": outcome.status,
                      "duration": round(duration, 6)}
            opened = outcome.opened
            if opened is not None:
                failed = outcome.error is not None
                # a 5xx answer is a failure of the endpoint even when it reached the client whole
                opened.lease.release(ok=not failed and outcome.status < 500)
                if failed:
                    self._count_error(pool, "stream_cut")
                self.metrics.ttfb.labels(pool.name).observe(opened.ttfb_s)
                fields.update(endpoint=opened.lease.endpoint.url, ttfb=round(opened.ttfb_s, 6))
                if traffic is not None and outcome.ok and isinstance(opened.response.stream, TokenMeter):
                    self._record_tpot(traffic, pool, opened.response.stream)
            if outcome.error is not None:
                fields["error"] = outcome.error.code or outcome.error.error_type
            self.log.info("request", **fields)

        timeouts = pool.spec.timeouts
        relay_timeouts = RelayTimeouts(first_chunk_s=timeouts.first_byte_s,
                                       keepalive_s=self.settings.keepalive_s)
        extra = {"x-specgate-pool": pool.name, "x-specgate-rule": rule, "x-request-id": rid}
        return Exchange(open_upstream, extra, relay_timeouts, finish)

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

    def _count_error(self, pool: Pool, kind: str) -> None:
        self.metrics.upstream_errors.labels(pool.name, kind).inc()

    def _count_retry(self, pool: Pool) -> None:
        self.metrics.retries.labels(pool.name).inc()


async def _metered(opening: Awaitable[Opened]) -> Opened:
    """Count a streamed answer's events on their way through (see traffic.TokenMeter)."""
    opened = await opening
    if opened.response.headers.get("content-type", "").startswith("text/event-stream"):
        opened.response.stream = TokenMeter(opened.response.stream)
    return opened
