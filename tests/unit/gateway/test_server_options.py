"""How the gateway's own HTTP server is configured."""

from __future__ import annotations

import httpx

from gateway.settings import Settings
from specgate.workers import uvicorn_options


def test_idle_client_connections_outlive_the_clients_own_keep_alive() -> None:
    """A server that closes an idle connection as the client reuses it loses that
    request (the client reads a reset). Kept longer than httpx keeps its idle
    connections (the openai and anthropic clients use httpx), the client closes first."""
    settings = Settings()
    options = uvicorn_options(settings)
    assert options["timeout_keep_alive"] == settings.keep_alive_s
    client_expiry = httpx.Limits().keepalive_expiry
    assert client_expiry is not None and settings.keep_alive_s > 2 * client_expiry
    assert uvicorn_options(Settings(keep_alive_s=120))["timeout_keep_alive"] == 120
