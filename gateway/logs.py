"""structlog set-up: one JSON object per line on stderr, rendered by one
processor (gateway/log_line.py).

The loggers are structlog's filtering bound loggers but for `info`, `warning`
and `error`, which run in one frame (`filtering_logger`): structlog's go
through four (the level's method, `_proxy_to_logger`, `_process_event`, then
the writer's) and copy the keywords twice on the way, 57k instructions for a
request line of which the line itself is 21k. The processors are the
configured ones, so `structlog.testing.capture_logs` sees every event as before.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import structlog
from structlog.exceptions import DropEvent
from structlog.typing import FilteringBoundLogger

from gateway.log_line import Clock, LineWriter, render_line


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
    hot = {name: _one_frame(name, getattr(base, name)) for name in ("info", "warning", "error")
           if logging.getLevelName(name.upper()) >= min_level}
    return type(base.__name__, (base,), hot)


def _one_frame(name: str, structlogs: Callable[..., Any]) -> Callable[..., Any]:
    def log(self: Any, event: str, *args: Any, **kw: Any) -> Any:
        if args:  # %-style arguments: structlog's own method
            return structlogs(self, event, *args, **kw)
        event_dict = self._context.copy()
        event_dict.update(kw)
        event_dict["event"] = event
        try:
            for processor in self._processors:
                event_dict = processor(self._logger, name, event_dict)
        except DropEvent:
            return None
        if isinstance(event_dict, (str, bytes, bytearray)):  # what the last processor returns, read as structlog does
            return getattr(self._logger, name)(event_dict)
        if isinstance(event_dict, tuple):
            return getattr(self._logger, name)(*event_dict[0], **event_dict[1])
        if isinstance(event_dict, dict):
            return getattr(self._logger, name)(**event_dict)
        raise ValueError("the last processor must return a str, bytes, bytearray, tuple or dict")

    log.__name__ = name
    return log


def _factory(writer: LineWriter) -> Callable[..., LineWriter]:
    """structlog's logger factory: every logger writes through the one `writer`."""
    return lambda *args: writer
