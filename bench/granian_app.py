"""The gateway app built as `specgate serve` builds it, for another ASGI server.

`bench/overhead.py --granian` serves it with granian (`--factory
granian_app:gateway`) beside the gateway under uvicorn: what the server
itself costs a request, side by side. Under granian the gateway lacks what
lives in its uvicorn protocol class (the header deadline, the 431 while
parsing, the abort and disconnect extensions, writes gathered per turn).
"""

from __future__ import annotations

from starlette.types import ASGIApp


def gateway() -> ASGIApp:
    from gateway.edge.app import create_app
    from gateway.logs import configure_logging
    from gateway.settings import Settings

    settings = Settings()
    configure_logging(settings.log_level)
    return create_app(settings)
