"""structlog set-up: one JSON object per line on stderr, rendered by one
processor and written by `LineWriter` (both in gateway/log_line.py).

The loggers are structlog's filtering bound loggers but for `info`, `warning`
and `error`, which run in one frame (`filtering_logger`, with log_line.py's
`one_frame`, compiled with the request path): structlog's go
through four (the level's method, `_proxy_to_logger`, `_process_event`, then
the writer's) and copy the keywords twice on the way, 57k instructions for a
request line of which the line itself is 21k. The processors are the
configured ones, so `structlog.testing.capture_logs` sees every event as before.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import structlog
from structlog.typing import FilteringBoundLogger

from gateway.log_line import Clock, LineWriter, one_frame, render_line


def configure_logging(level: str = "info") -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    structlog.configure(
        processors=[render_line(Clock())],
        wrapper_class=filtering_logger(numeric),
        logger_factory=_factory(LineWriter(sys.stderr)),
        cache_logger_on_first_use=True,
    )


def filtering_logger(min_level: int) -> type[FilteringBoundLogger]:
    """structlog's filtering bound logger at `min_level`, with `info`, `warning` and
    `error` in one frame each (those below `min_level` stay structlog's no-ops)."""
    base = structlog.make_filtering_bound_logger(min_level)
    hot = {name: one_frame(name, getattr(base, name)) for name in ("info", "warning", "error")
           if logging.getLevelName(name.upper()) >= min_level}
    return type(base.__name__, (base,), hot)


def _factory(writer: LineWriter) -> Callable[..., LineWriter]:
    """structlog's logger factory: every logger writes through the one `writer`."""
    return lambda *args: writer
