"""Run the gateway: an OpenAI-compatible server in front of the policy's pools.

Settings come from SPECGATE_* environment variables; the flags below override them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specgate.compiled import MODES, use_compiled  # the standard library only: light for the parser
from specgate.workers import serve_worker, supervise, uvicorn_options

WORKERS_HELP = (
    "worker processes, each a whole gateway, sharing the port through SO_REUSEPORT (default 1). "
    "More than 1 needs SPECGATE_STATE_URL, so the workers share overrides, the guard and the "
    "load through Redis. SIGTERM or SIGINT stops every worker, each draining for "
    "SPECGATE_DRAIN_TIMEOUT_S; if a worker dies, serve names it on stderr, stops the others "
    "and exits 1, so a supervisor (systemd, Kubernetes) restarts the whole")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, help="policy YAML (default: $SPECGATE_POLICY or "
                        "policies/default.yaml)")
    parser.add_argument("--host", help="address to listen on (default: $SPECGATE_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default: $SPECGATE_PORT or 8080)")
    parser.add_argument("--log-level", help="debug, info, warning or error (default: info)")
    parser.add_argument("--workers", type=int, default=1, metavar="N", help=WORKERS_HELP)
    parser.add_argument("--compiled", choices=MODES, default="auto",
                        help="the request path compiled with mypyc (`specgate compile`): auto uses the "
                        "build while it matches the sources and says why not otherwise; require refuses to "
                        "start without one; off runs the sources (default: auto)")
    parser.add_argument("--compiled-dir", type=Path, help="where `specgate compile --out` put the build "
                        "(default: build/compiled beside the gateway package)")
    # set by `--workers N` on the processes it starts: the read end of a pipe that closes when it exits
    parser.add_argument("--worker-of", type=int, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    try:  # first: the finder must come before any module of the decision is imported
        compiled = use_compiled(args.compiled, args.compiled_dir)
    except RuntimeError as exc:
        print(f"specgate serve --compiled require: {exc}", file=sys.stderr)
        return 1

    import structlog

    from gateway.logs import configure_logging
    from gateway.settings import Settings

    overrides = {key: value for key, value in
                 {"policy": args.policy, "host": args.host, "port": args.port,
                  "log_level": args.log_level}.items() if value is not None}
    settings = Settings(**overrides)
    if args.workers != 1 and args.worker_of is None:
        return supervise(args, settings)
    configure_logging(settings.log_level)
    structlog.get_logger("specgate.serve").info("compiled" if compiled.compiled else "not_compiled",
                                                modules=len(compiled.modules), why=compiled.why)
    app = _app(settings)
    if app is None:
        return 1
    if args.worker_of is not None:
        return serve_worker(app, settings, args.worker_of)
    import uvicorn

    from specgate.server import GatewayServer
    server = GatewayServer(uvicorn.Config(app, **uvicorn_options(settings)))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn raises the SIGINT that stopped it again once drained
        pass
    return 0 if server.started else 3  # 3: uvicorn's exit status for a failed start


def _app(settings: Any) -> Any:
    """The gateway app, or None after saying on stderr why the policy cannot be used."""
    from gateway.edge.app import create_app
    from gateway.policy.loader import PolicyError
    try:
        return create_app(settings)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return None
