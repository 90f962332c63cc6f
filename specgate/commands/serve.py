"""Run the gateway: an OpenAI-compatible server in front of the policy's pools.

Settings come from SPECGATE_* environment variables; the flags below override them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, help="policy YAML (default: $SPECGATE_POLICY or "
                        "policies/default.yaml)")
    parser.add_argument("--host", help="address to listen on (default: $SPECGATE_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default: $SPECGATE_PORT or 8080)")
    parser.add_argument("--log-level", help="debug, info, warning or error (default: info)")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.decide.policy import PolicyError
    from gateway.edge.app import create_app
    from gateway.edge.http_protocol import with_header_timeout
    from gateway.logs import configure_logging
    from gateway.settings import Settings

    overrides = {key: value for key, value in
                 {"policy": args.policy, "host": args.host, "port": args.port,
                  "log_level": args.log_level}.items() if value is not None}
    settings = Settings(**overrides)
    configure_logging(settings.log_level)
    try:
        app = create_app(settings)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    # uvicorn types the drain as int but waits with asyncio: a float is kept exact (int() made 0.8 s none)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=settings.drain_timeout_s,  # type: ignore[arg-type]  # float: drained exactly
                http=with_header_timeout(settings.header_timeout_s),
                lifespan="on")
    return 0
