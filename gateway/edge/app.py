"""`create_app(settings)`: the only place where the gateway's parts are wired.

`GatewayParts` builds and holds one gateway's parts and knows their life
(start-up, shutdown, what a policy reload touches); `create_app` serves them
as a Starlette app behind the edge middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import httpx
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.capture.stage import Capture
from gateway.control.flag_file import FlagFile, restore_initial
from gateway.control.guard import Guard
from gateway.control.leader import Leader, holder_name
from gateway.control.reload import PolicyReloader
from gateway.control.signals import PrometheusSource, ScrapeSource
from gateway.control.verdicts import SharedVerdicts
from gateway.decide.routing import cold_model
from gateway.decide.traffic import ClassLatency
from gateway.edge.admin import AdminAPI
from gateway.edge.auth import ClientKeys
from gateway.edge.endpoints import ProxyEndpoints
from gateway.edge.error_answers import exception_handlers
from gateway.edge.learning import AnswerLearner
from gateway.edge.middleware import FastHandler, GatewayApp, HeaderLimitMiddleware, RequestIdMiddleware
from gateway.edge.tracing import TracingMiddleware, tracer_for
from gateway.flags import FlagStore, PoolFlag, reason_word
from gateway.metrics import Children, GatewayMetrics
from gateway.policy.compiled import Policy
from gateway.policy.loader import load_policy
from gateway.settings import Settings
from gateway.state.fleet_load import FleetLoad, LocalCounts, nowhere
from gateway.state.overrides import SharedOverrides
from gateway.state.shared_learning import Observation, SharedLearning
from gateway.state.store import StateStore
from gateway.telemetry.spans import Tracer
from gateway.upstream.pools import Endpoint, HealthMonitor, Pool
from gateway.upstream.runtime import Runtime

SignalSources = dict[str, ScrapeSource | PrometheusSource]


class HotRoute(Route):
    """A POST route that carries most traffic: the request-id middleware calls
    its handler straight (see RequestIdMiddleware)."""

    def __init__(self, path: str, endpoint: FastHandler) -> None:
        super().__init__(path, endpoint, methods=["POST"])
        self.handler = endpoint


def fast_paths(routes: Sequence[BaseRoute]) -> dict[str, FastHandler]:
    """The middleware's table, read off the route list."""
    return {route.path: route.handler for route in routes if isinstance(route, HotRoute)}


class GatewayParts:
    def __init__(self, settings: Settings, policy: Policy, tracer: Tracer | None = None) -> None:
        self.settings = settings
        self.tracer = tracer or tracer_for(settings)  # the no-op one unless tracing is on
        self.metrics = GatewayMetrics()
        self.state = state_store(settings, self.metrics)  # before the parts that share through it
        self.fleet, self.learning = self._shared_routing()
        self.runtime = Runtime(policy, others=self.fleet.others if self.fleet is not None else nowhere,
                               on_health_change=self._record_health)
        self.flags = FlagStore(policy.speculative_pools)
        self.overrides = SharedOverrides(self.state, self.flags) if self.state is not None else None
        self.class_latency = ClassLatency()
        self.latency = cold_model(policy)
        self.learner = AnswerLearner(self.latency, self.runtime, Children(self.metrics.acceptance), self.learning)
        self.capture = Capture(policy.spec.capture, self.metrics, base=Path(policy.source).absolute().parent)
        self.proxy = ProxyEndpoints(settings, self.runtime, self.flags, self.metrics,
                                    ClientKeys.load(settings.api_keys, settings.api_keys_file),
                                    class_latency=self.class_latency, latency=self.latency,
                                    capture=self.capture, observers=[self.learner.observe])
        self.log = structlog.get_logger("specgate")
        self.health = HealthMonitor(httpx.AsyncClient(trust_env=False))
        self.reloader = PolicyReloader(settings.policy, self.apply, self.metrics)
        self.sources: SignalSources = {"scrape": ScrapeSource()}
        if settings.prometheus_url:
            self.sources["prometheus"] = PrometheusSource(settings.prometheus_url)
        self.verdicts = self._guard_verdicts()
        self.guard = Guard(self.runtime, self.flags, self.metrics, self.sources, class_latency=self.class_latency,
                           leadership=self.verdicts.leader if self.verdicts else None, sink=self.verdicts)
        self.admin = AdminAPI(settings.admin_token, self.proxy, self.flags, self.reloader,
                              guard_status=self.guard.status, overrides=self.overrides)
        self.flags.add_listener(self.record_flag)
        self.flag_file = self._flag_file(settings)
        for name, flag in self.flags.snapshot().items():
            self.metrics.speculative_enabled.labels(name).set(int(flag.routable))

    def routes(self) -> list[BaseRoute]:
        proxy = self.proxy
        return [
            HotRoute("/v1/chat/completions", proxy.chat),
            HotRoute("/v1/completions", proxy.completions),
            HotRoute("/v1/messages", proxy.messages),
            HotRoute("/v1/responses", proxy.responses),
            Route("/v1/models", proxy.models, methods=["GET"]),
            Route("/v1/{rest:path}", proxy.passthrough, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            *self.admin.routes(),
        ]

    def apply(self, policy: Policy) -> None:
        """A reloaded policy: the pools, the flags, and the watch on the pools."""
        self.runtime.apply(policy)
        self.capture.apply(policy.spec.capture)
        self.flags.sync_pools(policy.speculative_pools)
        if (self.latency.schedules != policy.schedules or self.latency.priors.spec != policy.spec.routing.priors
                or self.latency.half_life_s != policy.spec.routing.half_life_s):
            self.latency = self.proxy.latency = self.learner.latency = cold_model(policy)  # the priors differ
        self.watch_pools()

    def learned(self, seen: Observation) -> None:
        """Another replica's observation: into this replica's model as if made here."""
        self.latency.observe(seen.pool, seen.cls, seen.load, seen.ttft_s, seen.tpot_s)

    def _shared_routing(self) -> tuple[FleetLoad | None, SharedLearning | None]:
        """With shared state: the fleet's load for routing, and the latency model's observations merged."""
        if self.state is None:
            return None, None
        replica = holder_name()  # this process, as the fleet's keys name it
        fleet = FleetLoad(self.state, replica, self.local_counts)
        return fleet, SharedLearning(self.state, replica, self.learned)

    def local_counts(self) -> LocalCounts:
        """What this replica publishes to the fleet (read by the fleet's background task, after start-up)."""
        return self.runtime.counts()

    def _guard_verdicts(self) -> SharedVerdicts | None:
        """With shared state one guard leads and the others apply its verdicts; alone, it leads."""
        self.metrics.guard_leader.set(int(self.state is None))
        if self.state is None:
            return None
        s, state = self.settings, self.state
        return SharedVerdicts(state, lambda take_over: Leader(
            state, ttl_s=s.guard_lease_ttl_s, renew_s=s.guard_lease_renew_s,
            on_change=self.metrics.guard_leader.set, before_leading=take_over,
        ), self.flags, self.runtime.reported, read_s=s.guard_lease_renew_s)

    def _flag_file(self, settings: Settings) -> FlagFile | None:
        """Alone, the flags file keeps and shares modes; with a store it gives the initial ones only."""
        if not settings.flags_file:
            return None
        if self.state is None:
            flag_file = FlagFile(settings.flags_file, self.flags)
            flag_file.restore()
            return flag_file
        restore_initial(settings.flags_file, self.flags)
        self.log.info("flags_file_initial_only", path=str(settings.flags_file),
                      detail="SPECGATE_STATE_URL is set: the store holds the modes; the file is not watched "
                             "or written")
        return None

    def record_flag(self, pool: str, before: PoolFlag, after: PoolFlag) -> None:
        self.metrics.speculative_enabled.labels(pool).set(int(after.routable))
        if before.routable != after.routable:
            self.metrics.flag_flips.labels(pool, reason_word(after.reason)).inc()
        following = self.verdicts is not None and self.verdicts.applying  # the leader logs the flip
        log = self.log.debug if following else self.log.info
        log("flag_changed", pool=pool, mode=after.mode.value, enabled=after.routable,
            reason=after.reason, evidence=dict(after.evidence), disabled_classes=sorted(after.disabled_classes))

    def watch_pools(self) -> None:
        """Health checks on the pools in force, and their endpoints' gauges."""
        for pool in self.runtime.pools.values():  # each pool reports its changes itself (Runtime's on_health_change)
            self._record_health(pool)
        with contextlib.suppress(RuntimeError):  # before start-up the lifespan calls this again
            self.health.watch(self.runtime.pools.values())

    def _record_health(self, pool: Pool, changed: Endpoint | None = None) -> None:
        for endpoint in pool.endpoints:
            self.metrics.endpoint_healthy.labels(pool.name, endpoint.url).set(_up(endpoint))

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # Before serving: the port opens, and /readyz answers, only once the scrubbing process's scrubber is built
        await self.capture.prepare()
        self._log_files()
        self.watch_pools()
        if self.state is not None:
            self.state.start()
        for shared in (self.fleet, self.learning, self.verdicts):
            if shared is not None:
                shared.start()
        if self.overrides is not None:  # the stored modes before serving, if Redis answers in time
            await self.overrides.start(self.settings.state_start_wait_s)
        interval = self.settings.policy_watch_interval_s
        tasks = [asyncio.create_task(self.reloader.watch(interval)), asyncio.create_task(self.guard.run()),
                 asyncio.create_task(self.capture.run())]
        if self.flag_file is not None:
            tasks.append(asyncio.create_task(self.flag_file.watch(interval)))
        with _signal(signal.SIGHUP, self.reloader.reload_soon):
            try:
                yield
            finally:
                await self._stop(tasks)

    def _log_files(self) -> None:
        """The files this process reads and writes, as absolute paths: a later change of
        its working directory changes none of them."""
        capture = self.capture.files
        self.log.info("files", policy=str(self.settings.policy), flags_file=_named(self.settings.flags_file),
                      api_keys_file=_named(self.settings.api_keys_file),
                      capture_directory=_named(capture.directory if capture is not None else None))

    async def _stop(self, tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.capture.close()  # the scrubbing process ends with the gateway
        if self.verdicts is not None:  # first, so that another guard leads at once
            await self.verdicts.aclose()
        if self.flag_file is not None:
            await self.flag_file.flush()
        for source in self.sources.values():
            await source.aclose()
        await self.health.stop()
        await self.health.client.aclose()
        await self.runtime.aclose()
        if self.overrides is not None:
            await self.overrides.aclose()
        for shared in (self.fleet, self.learning):
            if shared is not None:
                await shared.aclose()
        if self.state is not None:
            await self.state.aclose()
        if self.tracer.enabled:
            await asyncio.to_thread(self.tracer.shutdown)  # the spans still batched go out
        self.log.info("stopped")  # after the drain (or its timeout)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        available = [name for name, pool in self.runtime.pools.items() if pool.has_available()]
        status = 200 if available else 503
        return JSONResponse({"ready": bool(available), "pools_available": available,
                             "policy": self.runtime.policy.source}, status_code=status)

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=self.metrics.content_type)


def create_app(settings: Settings, policy: Policy | None = None) -> Starlette:
    parts = GatewayParts(settings, policy or load_policy(settings.policy))
    routes = parts.routes()
    app = GatewayApp(routes=routes, lifespan=parts.lifespan, exception_handlers=dict(exception_handlers()))
    app.add_middleware(RequestIdMiddleware, hot=fast_paths(routes))
    if parts.tracer.enabled:  # outside the request id's fast path, so that the hot routes are traced too
        app.add_middleware(TracingMiddleware, tracer=parts.tracer)
    app.add_middleware(HeaderLimitMiddleware, max_bytes=settings.max_header_bytes)
    app.state.settings = settings
    app.state.runtime = parts.runtime
    app.state.flags = parts.flags
    app.state.metrics = parts.metrics
    app.state.proxy = parts.proxy
    app.state.reloader = parts.reloader
    app.state.guard = parts.guard
    app.state.parts = parts
    return app


def state_store(settings: Settings, metrics: GatewayMetrics) -> StateStore | None:
    """The shared state store when SPECGATE_STATE_URL is set; None: this process decides alone."""
    metrics.state_configured.set(int(bool(settings.state_url)))
    if not settings.state_url:
        return None
    return StateStore(settings.state_url, settings.state_namespace, metrics, settings.state_timeout_s)


def _named(path: Path | None) -> str | None:
    return None if path is None else str(path)


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
