"""Fixtures: fake vLLM pools and a real gateway, all on 127.0.0.1."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.settings import Settings
from gateway.upstream.meter import Measurement
from tests.fakes.vllm import FakeVllm

ADMIN_TOKEN = "test-admin-token"
START_GUARD_S = 120.0


def policy_dict(spec_urls: list[str], std_urls: list[str], **pool_options) -> dict:
    """The default policy's shape, pointed at the given endpoints, with fast health checks."""
    health = {"interval_s": 0.2, "eject_after": 2, "backoff_s": 0.5, "max_backoff_s": 2}
    pool = {"timeouts": {"connect_s": 1, "first_byte_s": 5, "total_s": 10}, "health": health, **pool_options}
    return {
        "version": 1,
        "pools": {
            "speculative": {"kind": "speculative", "endpoints": [{"url": u} for u in spec_urls],
                            "model": "upstream-spec", "fallback": "standard", **pool},
            "standard": {"kind": "standard", "endpoints": [{"url": u} for u in std_urls],
                         "model": "upstream-std", **pool},
        },
        "domains": {"code": {"patterns": ["```", "\\bdef\\s"]}},
        "overrides": {"route_header": True, "domain_header": True},
        "rules": [
            {"name": "hot-sampling", "when": {"temperature": {"gt": 1.0}}, "route": "standard"},
            {"name": "short-output", "when": {"max_tokens": {"lt": 32}}, "route": "standard"},
            {"name": "default", "route": "speculative"},
        ],
        "guard": {"enabled": False},
    }


class Gateway:
    def __init__(self, app, server: BackgroundServer, policy_path: Path) -> None:
        self.app = app
        self.server = server
        self.policy_path = policy_path

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def base_url(self) -> str:
        return self.server.url + "/v1"

    def write_policy(self, policy: dict) -> None:
        tmp = self.policy_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(policy, sort_keys=False))
        tmp.replace(self.policy_path)


@pytest.fixture
def spec_fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="upstream-spec", kind="speculative") as fake:
        yield fake


@pytest.fixture
def std_fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="upstream-std", kind="standard") as fake:
        yield fake


@pytest.fixture
def start_gateway(tmp_path) -> Iterator[Callable[..., Gateway]]:
    servers: list[BackgroundServer] = []

    def start(policy: dict, http: Any = "auto", **settings) -> Gateway:
        """`http`: uvicorn's HTTP protocol; `with_header_timeout(...)` serves as `specgate serve` does."""
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(policy, sort_keys=False))
        options = {"policy": path, "admin_token": ADMIN_TOKEN, "keepalive_s": 10.0,
                   "policy_watch_interval_s": 0.2, **settings}
        app = create_app(Settings(**options))
        # a hang guard: with capture on, start-up builds the scrubber (seconds: a process of its own imports presidio)
        server = BackgroundServer(app, lifespan="on", http=http).start(timeout=START_GUARD_S)
        servers.append(server)
        return Gateway(app, server, path)

    yield start
    for server in servers:
        server.stop(graceful=True)


@pytest.fixture
def gateway(start_gateway, spec_fake, std_fake) -> Gateway:
    return start_gateway(policy_dict([spec_fake.url], [std_fake.url]))


@pytest.fixture
def measured(gateway: Gateway) -> queue.Queue[Measurement]:
    """Each measurement the gateway hands to its sinks, as it is made."""
    found: queue.Queue[Measurement] = queue.Queue()
    gateway.app.state.proxy.recorder.sinks.append(found.put)
    return found
