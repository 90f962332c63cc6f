"""Gateway replicas sharing one Redis, in this process (each a real HTTP server
on loopback), for the fleet-wide load and shared learning tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from backends.serving.server import BackgroundServer
from gateway.edge.app import GatewayParts, create_app
from gateway.settings import Settings

ADMIN_TOKEN = "fleet-admin-token"
CHAT = {"model": "any", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 64}


def policy(spec_url: str, std_url: str, busy_at: int) -> dict[str, Any]:
    """Two pools; at `busy_at` requests in flight on the speculative pool the
    `busy` rule sends the rest to the standard pool."""
    pool = {"timeouts": {"connect_s": 1, "first_byte_s": 10, "total_s": 60},
            "health": {"interval_s": 0.5, "eject_after": 3, "backoff_s": 0.5, "max_backoff_s": 2}}
    return {
        "version": 1,
        "pools": {
            "speculative": {"kind": "speculative", "endpoints": [{"url": spec_url}], "model": "upstream-spec",
                            "fallback": "standard", **pool},
            "standard": {"kind": "standard", "endpoints": [{"url": std_url}], "model": "upstream-std", **pool},
        },
        "rules": [
            {"name": "busy", "when": {"load.speculative": {"ge": busy_at}}, "route": "standard"},
            {"name": "default", "route": "speculative"},
        ],
        "guard": {"enabled": False},
    }


class Replica:
    def __init__(self, directory: Path, policy: dict[str, Any], state_url: str, **settings: Any) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "policy.yaml"
        path.write_text(yaml.safe_dump(policy, sort_keys=False))
        self.app = create_app(Settings(policy=path, admin_token=ADMIN_TOKEN, state_url=state_url,
                                       policy_watch_interval_s=0.5, **settings))
        self.parts: GatewayParts = self.app.state.parts
        self.server = BackgroundServer(self.app, lifespan="on").start()
        self.admin = httpx.Client(base_url=self.server.url, timeout=10,
                                  headers={"authorization": f"Bearer {ADMIN_TOKEN}"})

    @property
    def base_url(self) -> str:
        return self.server.url + "/v1"

    def explain(self) -> dict[str, Any]:
        response = self.admin.post("/admin/explain", json=CHAT)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    def latency(self) -> dict[str, Any]:
        response = self.admin.get("/admin/latency")
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    def stop(self) -> None:
        self.admin.close()
        self.server.stop(graceful=True)

