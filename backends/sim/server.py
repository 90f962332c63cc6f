"""The simulated vLLM server: a `SimEngine` behind the shared serving app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from backends.serving import VllmMetrics, create_openai_app
from backends.sim.engine import SimEngine
from backends.sim.model import DEFAULT_PARAMS, Kind, SimParams


def create_sim_app(
    kind: Kind,
    model: str,
    *,
    params: SimParams = DEFAULT_PARAMS,
    time_scale: float = 1.0,
    seed: int | None = None,
    max_model_len: int = 8192,
) -> tuple[Starlette, SimEngine]:
    """An app that answers like a vLLM `kind` pool serving `model`, and its engine."""
    speculative_tokens = params.num_speculative_tokens if kind != "standard" else None
    metrics = VllmMetrics(CollectorRegistry(), model, num_speculative_tokens=speculative_tokens)
    engine = SimEngine(kind, metrics, params, time_scale=time_scale, seed=seed)
    app = create_openai_app(engine, metrics, model, max_model_len=max_model_len)
    return app, engine
