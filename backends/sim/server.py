"""The simulated vLLM server: a `SimEngine` behind the shared serving app,
plus `/control`, which changes the simulated draft while the server runs."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from backends.serving import VllmMetrics, create_openai_app
from backends.sim.engine import SimEngine
from backends.sim.model import DEFAULT_PARAMS, Kind, SimParams
from backends.sim.prefix_cache import BLOCK_TOKENS, PrefixCache


def create_sim_app(
    kind: Kind,
    model: str,
    *,
    params: SimParams = DEFAULT_PARAMS,
    time_scale: float = 1.0,
    seed: int | None = None,
    max_model_len: int = 8192,
    prefix_cache: bool = True,
) -> tuple[Starlette, SimEngine]:
    """An app that answers like a vLLM `kind` pool serving `model`, and its engine;
    `prefix_cache` caches prompt prefixes up to `params.prefix_cache_tokens`."""
    speculative_tokens = params.num_speculative_tokens if kind != "standard" else None
    metrics = VllmMetrics(CollectorRegistry(), model, num_speculative_tokens=speculative_tokens)
    cache = PrefixCache(max(1, params.prefix_cache_tokens // BLOCK_TOKENS)) if prefix_cache else None
    engine = SimEngine(kind, metrics, params, time_scale=time_scale, seed=seed, prefix_cache=cache, model_name=model)
    app = create_openai_app(engine, metrics, model, max_model_len=max_model_len,
                            spec_decode_metrics=speculative_tokens)  # as --per-request-spec-decode-metrics summary
    app.router.routes.append(Route("/control", _control(engine), methods=["GET", "POST"]))
    return app, engine


def _control(engine: SimEngine) -> Any:
    """`POST /control {"domain_quality": {"code": 0.3}}` multiplies the
    acceptance of that domain's drafts by 0.3 from now on (1.0 restores it);
    GET or POST answers the factors in force."""

    async def control(request: Request) -> JSONResponse:
        if request.method == "POST":
            problem = _apply(engine, await request.body())
            if problem:
                return JSONResponse({"error": problem}, status_code=400)
        return JSONResponse({"domain_quality": engine.domain_quality})

    return control


def _apply(engine: SimEngine, raw: bytes) -> str | None:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return "the body is not JSON"
    if not isinstance(body, dict) or set(body) - {"domain_quality"}:
        return 'expected {"domain_quality": {domain: factor}}'
    factors = body.get("domain_quality") or {}
    if not isinstance(factors, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1 for v in factors.values()
    ):
        return "domain_quality maps a domain to a factor in (0, 1]"
    for domain, factor in factors.items():
        engine.set_domain_quality(str(domain), float(factor))
    return None
