"""A log event as its JSON line: the one processor every line of the gateway's goes through.

`render_line` adds the level, a UTC ISO 8601 timestamp (`Clock`) and a
traceback where one was passed, and writes the JSON. The request line runs
once per request, and structlog's chain of four processors (one call, one dict
update and one `datetime` each) cost about twice what the line itself does;
the line and its keys are the same as that chain wrote. It is a module of the
compiled request path (specgate/compiled.py): the clock and the render are
no Python calls there.

`LineWriter` writes the lines: structlog's `WriteLogger`, as a compiled class. `one_frame`
is a logger's `info`, `warning` or `error` in one frame (gateway/logs.py puts them on
structlog's filtering logger): compiled here, a method of a class built at run time is no
Python frame either.

The JSON is orjson's: the standard library's encoder builds a new C encoder
and a dict of the objects it has seen on every call, and writes each float
through its repr, which made it a twentieth of a request's instructions. A
line orjson cannot write (an integer past 64 bits, a key that is not a
string, a string that is not valid Unicode) is written by the standard
library's, as before. Text outside ASCII is written as UTF-8, not escaped.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import orjson
from structlog.exceptions import DropEvent
from structlog.processors import format_exc_info
from structlog.typing import EventDict, Processor, WrappedLogger

LEVELS = {"warn": "warning", "exception": "error"}  # structlog's names for these methods' level


class Clock:
    """A UTC ISO 8601 timestamp with microseconds, its date and time of day formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self) -> str:
        now = time.time_ns()
        second = now // 1_000_000_000
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
        # the microseconds' six digits without a format spec: compiled, the f-string's `:06d` and its
        # pieces were two method calls, and the clock 7.1k instructions a line (2.2k now)
        return self._prefix + str(1_000_000 + now // 1000 % 1_000_000)[1:] + "Z"


def render_line(clock: Clock) -> Processor:
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


class LineWriter:
    """Writes and flushes each line under a lock, as structlog's `WriteLogger` does; a compiled
    class, so the line's last call is no Python frame. One per file: every logger shares it.
    Its methods are the level names structlog's loggers call their logger's by."""

    def __init__(self, file: TextIO) -> None:
        self._file = file
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        with self._lock:
            self._file.write(message + "\n")
            self._file.flush()

    def debug(self, message: str) -> None:
        self.msg(message)

    def info(self, message: str) -> None:
        self.msg(message)

    def warning(self, message: str) -> None:
        self.msg(message)

    def error(self, message: str) -> None:
        self.msg(message)

    def critical(self, message: str) -> None:
        self.msg(message)


def one_frame(name: str, structlogs: Callable[..., Any]) -> Callable[..., Any]:
    """structlog's method `name` in one frame: the bound context, the processors, the logger's
    method, as structlog runs them; %-style arguments go to structlog's own (`structlogs`)."""
    def log(self: Any, event: str, *args: Any, **kw: Any) -> Any:
        if args:
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

    return log
