"""`create_app(settings)`: the only place where the gateway's parts are wired."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from urllib.parse import quote

import httpx
import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.control.flag_file import FlagFile
from gateway.control.guard import Guard
from gateway.control.reload import PolicyReloader
from gateway.control.signals import PrometheusSource, ScrapeSource
from gateway.decide.policy import Policy, load_policy
from gateway.decide.traffic import ClassLatency
from gateway.edge.admin import AdminAPI
from gateway.edge.auth import ClientKeys
from gateway.edge.endpoints import ProxyEndpoints, request_id
from gateway.edge.paths import normalise_target
from gateway.errors import GatewayError, HeadersTooLarge, InvalidRequest, MethodNotAllowed, NotFound, error_body
from gateway.flags import FlagStore, PoolFlag, reason_word
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings
from gateway.upstream.pools import Endpoint, HealthMonitor, Pool
from gateway.upstream.runtime import Runtime


class RequestIdMiddleware:
    """Give every request an id before anything can fail (accepted or generated),
    check and normalise its path (gateway.edge.paths) before anything routes on it,
    and send the hot routes straight to their handlers.

    The completion routes carry nearly all traffic; Starlette's exception
    middleware and router wrap every `send` and cost about a tenth of the CPU of
    a small proxied request, so those routes skip them. Errors are rendered the
    same way as on every other route.
    """

    def __init__(self, app: ASGIApp, hot: dict[str, Callable[[Request], Awaitable[ASGIApp]]]) -> None:
        self.app = app
        self.hot = hot
        self.rng = random.Random(os.urandom(16))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        scope.setdefault("state", {})["request_id"] = request_id(request, self.rng)
        try:
            scope["raw_path"], scope["path"] = normalise_target(
                scope.get("raw_path") or quote(scope["path"]).encode(), scope.get("query_string", b""))
        except GatewayError as exc:
            await (await _gateway_error(request, exc))(scope, receive, send)
            return
        handler = self.hot.get(scope["path"]) if scope["method"] == "POST" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(request)
        except GatewayError as exc:
            response = await _gateway_error(request, exc)
        except Exception as exc:  # noqa: BLE001 - the client gets an envelope, the log the type
            response = await _unexpected_error(request, exc)
        await response(scope, receive, send)


class HeaderLimitMiddleware:
    """Answer 431 to requests whose headers are over `max_bytes` (as on the wire)
    before anything reads or forwards them: uvicorn's httptools parser takes
    headers of any size."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            if size > self.max_bytes:
                error = HeadersTooLarge(f"request headers are {size} bytes, over the {self.max_bytes} "
                                        "byte limit")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(settings: Settings, policy: Policy | None = None) -> Starlette:
    policy = policy or load_policy(settings.policy)
    metrics = GatewayMetrics()
    runtime = Runtime(policy)
    flags = FlagStore(policy.speculative_pools)
    keys = ClientKeys.load(settings.api_keys, settings.api_keys_file)
    class_latency = ClassLatency()
    proxy = ProxyEndpoints(settings, runtime, flags, metrics, keys, class_latency=class_latency)
    log = structlog.get_logger("specgate")
    health = HealthMonitor(httpx.AsyncClient(trust_env=False))

    def apply(new_policy: Policy) -> None:
        runtime.apply(new_policy)
        flags.sync_pools(new_policy.speculative_pools)
        _watch_pools(runtime, metrics, health)

    reloader = PolicyReloader(settings.policy, apply, metrics)
    sources = {"scrape": ScrapeSource()}
    if settings.prometheus_url:
        sources["prometheus"] = PrometheusSource(settings.prometheus_url)
    guard = Guard(runtime, flags, metrics, sources, class_latency=class_latency)
    admin = AdminAPI(settings.admin_token, proxy, flags, reloader, guard_status=guard.status)

    def record_flag(pool: str, before: PoolFlag, after: PoolFlag) -> None:
        metrics.speculative_enabled.labels(pool).set(int(after.routable))
        if before.routable != after.routable:
            metrics.flag_flips.labels(pool, reason_word(after.reason)).inc()
        log.info("flag_changed", pool=pool, mode=after.mode.value, enabled=after.routable,
                 reason=after.reason, evidence=dict(after.evidence),
                 disabled_classes=sorted(after.disabled_classes))

    flags.add_listener(record_flag)
    flag_file = FlagFile(settings.flags_file, flags) if settings.flags_file else None
    if flag_file is not None:
        flag_file.restore()
    for name, flag in flags.snapshot().items():
        metrics.speculative_enabled.labels(name).set(int(flag.routable))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        _watch_pools(runtime, metrics, health)
        tasks = [asyncio.create_task(reloader.watch(settings.policy_watch_interval_s)),
                 asyncio.create_task(guard.run())]
        if flag_file is not None:
            tasks.append(asyncio.create_task(flag_file.watch(settings.policy_watch_interval_s)))
        with _signal(signal.SIGHUP, reloader.reload_quietly):
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if flag_file is not None:
                    await flag_file.flush()
                for source in sources.values():
                    await source.aclose()
                await health.stop()
                await health.client.aclose()
                await runtime.aclose()
                log.info("stopped")  # after the drain (or its timeout)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        available = [name for name, pool in runtime.pools.items() if pool.has_available()]
        status = 200 if available else 503
        return JSONResponse({"ready": bool(available), "pools_available": available,
                             "policy": runtime.policy.source}, status_code=status)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=metrics.content_type)

    routes = [
        Route("/v1/chat/completions", proxy.chat, methods=["POST"]),
        Route("/v1/completions", proxy.completions, methods=["POST"]),
        Route("/v1/models", proxy.models, methods=["GET"]),
        Route("/v1/{rest:path}", proxy.passthrough, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *admin.routes(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={GatewayError: _gateway_error, HTTPException: _http_error,
                            Exception: _unexpected_error},
    )
    app.add_middleware(RequestIdMiddleware, hot={"/v1/chat/completions": proxy.chat,
                                                 "/v1/completions": proxy.completions})
    app.add_middleware(HeaderLimitMiddleware, max_bytes=settings.max_header_bytes)
    app.state.settings = settings
    app.state.runtime = runtime
    app.state.flags = flags
    app.state.metrics = metrics
    app.state.proxy = proxy
    app.state.reloader = reloader
    app.state.guard = guard
    return app


def _watch_pools(runtime: Runtime, metrics: GatewayMetrics, health: HealthMonitor) -> None:
    def record(pool: Pool) -> None:
        for endpoint in pool.endpoints:
            metrics.endpoint_healthy.labels(pool.name, endpoint.url).set(_up(endpoint))

    for pool in runtime.pools.values():
        pool.on_health_change = lambda endpoint, pool=pool: record(pool)
        record(pool)
    with contextlib.suppress(RuntimeError):  # before start-up the lifespan calls this again
        health.watch(runtime.pools.values())


def _up(endpoint: Endpoint) -> int:
    return int(endpoint.healthy and not endpoint.ejected())


@contextlib.contextmanager
def _signal(signum: int, handler: Callable[[], None]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signum, handler)
        installed = True
    except (RuntimeError, ValueError, NotImplementedError):  # not the main thread
        installed = False
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signum)


def _with_request_id(request: Request, response: Response) -> Response:
    rid = getattr(request.state, "request_id", None)
    if rid:
        response.headers["x-request-id"] = rid
    return response


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return _with_request_id(request, exc.response())


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        error: GatewayError = MethodNotAllowed(f"method {request.method} is not allowed on {request.url.path}")
    elif exc.status_code == 404:
        error = NotFound(f"no route for {request.method} {request.url.path}")
    else:  # routing raises only 404 and 405; anything else is the client's fault too
        error = InvalidRequest(str(exc.detail))
    return _with_request_id(request, error.response(dict(exc.headers or {})))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    structlog.get_logger("specgate").error("unhandled_error", error=type(exc).__name__,
                                           path=request.url.path)
    body = error_body("internal gateway error", "internal_error")
    return _with_request_id(request, JSONResponse(body, status_code=500))
