"""Admin API: bearer token required; disabled (403) when no token is set."""

from __future__ import annotations

import hmac
import math
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.control.reload import PolicyReloader
from gateway.decide.apis import explained_endpoint
from gateway.decide.features import parse_json_body
from gateway.edge.body import read_body
from gateway.edge.endpoints import ProxyEndpoints
from gateway.errors import Forbidden, InvalidRequest, NotFound
from gateway.flags import FlagStore, Mode
from gateway.policy.loader import PolicyError
from gateway.state.overrides import SharedOverrides
from gateway.upstream.prompt_key import PromptKey

Handler = Callable[[Request], Awaitable[Response]]


class AdminAPI:
    def __init__(self, token: str | None, proxy: ProxyEndpoints, flags: FlagStore,
                 reloader: PolicyReloader, guard_status: Callable[[], dict[str, Any]] | None = None,
                 overrides: SharedOverrides | None = None) -> None:
        self.overrides = overrides  # set: modes are shared with every gateway on the state store
        self.guard_status = guard_status
        self._token = token.encode() if token else None
        self.proxy = proxy
        self.flags = flags
        self.reloader = reloader

    def routes(self) -> list[Route]:
        return [
            Route("/admin/explain", self._guarded(self.explain), methods=["POST"]),
            Route("/admin/flags", self._guarded(self.get_flags), methods=["GET"]),
            Route("/admin/flags/{pool}", self._guarded(self.put_flag), methods=["PUT"]),
            Route("/admin/guard", self._guarded(self.get_guard), methods=["GET"]),
            Route("/admin/latency", self._guarded(self.get_latency), methods=["GET"]),
            Route("/admin/policy", self._guarded(self.get_policy), methods=["GET"]),
            Route("/admin/policy/reload", self._guarded(self.reload), methods=["POST"]),
        ]

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            self._authorize(request)
            return await handler(request)
        return guarded

    def _authorize(self, request: Request) -> None:
        if self._token is None:
            raise Forbidden("the admin API is disabled: set SPECGATE_ADMIN_TOKEN to enable it")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
            raise Forbidden("admin token missing or wrong (Authorization: Bearer <token>)")

    async def explain(self, request: Request) -> Response:
        body = parse_json_body(await read_body(request, self.proxy.settings.max_body_bytes,
                                               self.proxy.settings.body_timeout_s))
        endpoint = explained_endpoint(request.query_params.get("endpoint"), body)
        routed = self.proxy.route(body, endpoint, request.headers)
        answer = routed.to_json(self.flags.snapshot())
        pool = self.proxy.runtime.pools.get(routed.decision.pool)
        if pool is not None:  # the endpoint it would take there now, and why
            answer["endpoint"] = pool.explain(PromptKey(body, endpoint, request.headers))
        answer["admission"] = self.proxy.admission(routed)
        return _json(answer)

    async def get_flags(self, request: Request) -> Response:
        flags = {name: flag.to_json() for name, flag in self.flags.snapshot().items()}
        if self.overrides is not None:
            for name, flag in flags.items():
                flag["override"] = self.overrides.describe(name)
        return _json(flags)

    async def put_flag(self, request: Request) -> Response:
        pool = request.path_params["pool"]
        if pool not in self.flags.snapshot():
            raise NotFound(f"unknown pool '{pool}'")
        body = parse_json_body(await read_body(request, 4096, self.proxy.settings.body_timeout_s))
        try:
            mode = Mode(body.get("mode"))
        except ValueError:
            raise InvalidRequest("'mode' must be one of auto, force_on, force_off", param="mode") from None
        if self.overrides is None:
            flag = self.flags.set_mode(pool, mode, reason=f"admin:{mode.value}")
            return _json({pool: flag.to_json()})
        flag, shared = await self.overrides.set(pool, mode, reason=f"admin:{mode.value}")
        answer = {**flag.to_json(), "override": self.overrides.describe(pool)}
        return _json({pool: answer}) if shared else JSONResponse(_finite({pool: answer}), status_code=202)

    async def get_guard(self, request: Request) -> Response:
        """The guard's last signals and state machine counters, per speculative pool."""
        if self.guard_status is None:
            raise NotFound("this gateway runs no guard")
        return _json(self.guard_status())

    async def get_latency(self, request: Request) -> Response:
        """The latency model `route: fastest` reads: its priors and every (pool, class)'s tables."""
        if self.proxy.latency is None:
            raise NotFound("this gateway keeps no latency model")
        return _json(self.proxy.latency.snapshot())

    async def get_policy(self, request: Request) -> Response:
        policy = self.proxy.runtime.policy
        return _json({"source": policy.source, "policy": policy.spec.model_dump(mode="json"),
                      "last_reload_error": self.reloader.last_error})

    async def reload(self, request: Request) -> Response:
        try:
            policy = await self.reloader.reload()
        except PolicyError as exc:
            raise InvalidRequest(f"policy rejected, the previous one keeps serving: {exc}",
                                 code="policy_invalid") from None
        return JSONResponse({"status": "applied", "source": policy.source,
                             "pools": list(policy.pools), "rules": [r.name for r in policy.rules]})


def _json(content: Any) -> JSONResponse:
    """A JSON answer in which NaN and infinities read null: JSON has no such numbers,
    and a state that holds one must not turn an admin read into an error."""
    return JSONResponse(_finite(content))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
