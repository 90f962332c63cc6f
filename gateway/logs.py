"""structlog set-up: one JSON object per line on stderr.

Every line is rendered by one processor, `render_line`: the level, a UTC ISO
8601 timestamp, a traceback where one was passed, and the JSON. The request
line runs once per request, and structlog's chain of four processors (one
call, one dict update and one `datetime` each) cost about twice what the line
itself does; the line and its keys are the same as that chain wrote.

The JSON is orjson's: the standard library's encoder builds a new C encoder
and a dict of the objects it has seen on every call, and writes each float
through its repr, which made it a twentieth of a request's instructions. A
line orjson cannot write (an integer past 64 bits, a key that is not a
string, a string that is not valid Unicode) is written by the standard
library's, as before. Text outside ASCII is written as UTF-8, not escaped.

The loggers are structlog's filtering bound loggers but for `info`, `warning`
and `error`, which run in one frame (`filtering_logger`): structlog's go
through four (the level's method, `_proxy_to_logger`, `_process_event`, then
the writer's) and copy the keywords twice on the way, 57k instructions for a
request line of which the line itself is 21k. The processors are the
configured ones, so `structlog.testing.capture_logs` sees every event as before.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog
from structlog.exceptions import DropEvent
from structlog.processors import format_exc_info
from structlog.typing import EventDict, FilteringBoundLogger, WrappedLogger

LEVELS = {"warn": "warning", "exception": "error"}  # structlog's names for these methods' level


class Clock:
    """A UTC ISO 8601 timestamp with microseconds, its date and time of day formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self) -> str:
        second, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{nanoseconds // 1000:06d}Z"


def render_line(clock: Clock) -> structlog.typing.Processor:
    """The processor that turns an event into its JSON line."""
    encode = json.JSONEncoder(default=repr).encode  # a value JSON lacks is written as its repr
    fast, options = orjson.dumps, orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME  # those: repr

    def render(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
        event_dict["level"] = LEVELS.get(method_name, method_name)
        event_dict["timestamp"] = clock()
        if "exc_info" in event_dict:
            event_dict = format_exc_info(logger, method_name, event_dict)
        try:
            return fast(event_dict, default=repr, option=options).decode()
        except TypeError:  # orjson.JSONEncodeError: what only the standard library writes
            return encode(event_dict)

    return render


def configure_logging(level: str = "info") -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    structlog.configure(
        processors=[render_line(Clock())],
        wrapper_class=filtering_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
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
