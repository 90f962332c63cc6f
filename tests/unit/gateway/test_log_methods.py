"""The gateway's loggers: structlog's filtering bound loggers with `info`, `warning` and
`error` in one frame, writing through `LineWriter`. Each writes the line structlog's own methods
and writer write, below the level nothing, %-style arguments as structlog reads them, and
`capture_logs` still sees every event."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from gateway.log_line import Clock, LineWriter, render_line
from gateway.logs import configure_logging, filtering_logger

FIELDS = {"request_id": "r1", "api": "chat", "pool": "speculative", "status": 200, "duration": 0.0031}


def rendered(_: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> str:
    """A last processor without a clock, so that two loggers' lines compare whole."""
    return json.dumps({**event_dict, "level": method_name})


def logger(wrapper_class: type, out: io.StringIO, processors: list[Any] | None = None,
           writer: type = LineWriter) -> Any:
    return structlog.wrap_logger(writer(out), processors=processors or [rendered],
                                 wrapper_class=wrapper_class, worker=3)


def theirs(out: io.StringIO) -> Any:
    """structlog's own logger and writer."""
    return logger(structlog.make_filtering_bound_logger(logging.DEBUG), out, writer=structlog.WriteLogger)


@pytest.mark.parametrize("method", ["debug", "info", "warning", "warn", "error", "critical", "fatal", "msg"])
def test_each_method_writes_what_structlogs_own_writes(method: str) -> None:
    ours, their = io.StringIO(), io.StringIO()
    getattr(logger(filtering_logger(logging.DEBUG), ours), method)("request", **FIELDS)
    getattr(theirs(their), method)("request", **FIELDS)
    assert ours.getvalue() == their.getvalue()
    assert list(json.loads(ours.getvalue())) == ["worker", *FIELDS, "event", "level"]


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL])
def test_log_at_a_level_writes_what_structlogs_own_writes(level: int) -> None:
    ours, their = io.StringIO(), io.StringIO()
    logger(filtering_logger(logging.DEBUG), ours).log(level, "request", **FIELDS)
    theirs(their).log(level, "request", **FIELDS)
    assert ours.getvalue() == their.getvalue() != ""


def test_the_configured_loggers_write_one_line_each_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    try:
        log = structlog.get_logger("specgate.test")
        log.info("request", **FIELDS)
        log.debug("below the level")
        log.warning("slow", pool="standard")
    finally:
        structlog.reset_defaults()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["event"], line["level"]) for line in lines] == [("request", "info"), ("slow", "warning")]
    assert {k: lines[0][k] for k in FIELDS} == FIELDS


def test_below_the_level_nothing_is_written() -> None:
    out = io.StringIO()
    log = logger(filtering_logger(logging.WARNING), out)
    log.info("request", **FIELDS)
    log.warning("slow")
    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["slow"]


def test_percent_arguments_are_structlogs() -> None:
    out = io.StringIO()
    logger(filtering_logger(logging.INFO), out).info("%s of %d", "three", 4)
    assert json.loads(out.getvalue())["event"] == "three of 4"


def test_a_processor_that_drops_the_event_writes_nothing_and_capture_logs_sees_it() -> None:
    out = io.StringIO()
    structlog.configure(wrapper_class=filtering_logger(logging.INFO), logger_factory=structlog.WriteLoggerFactory(out),
                        processors=[rendered], cache_logger_on_first_use=False)
    try:
        with capture_logs() as captured:
            structlog.get_logger().info("request", **FIELDS)
    finally:
        structlog.reset_defaults()
    assert out.getvalue() == ""
    assert captured == [{**FIELDS, "event": "request", "log_level": "info"}]


@pytest.mark.parametrize("last", [lambda _l, _m, d: ((json.dumps(d),), {}), lambda _l, _m, d: {"message": d["event"]}])
def test_a_last_processor_may_return_args_and_keywords_as_structlog_allows(last: Any) -> None:
    class Recorded:
        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []

        def info(self, *args: Any, **kw: Any) -> None:
            self.calls.append((args, kw))

    ours, theirs = Recorded(), Recorded()
    structlog.wrap_logger(ours, processors=[last], wrapper_class=filtering_logger(logging.INFO)).info("e", a=1)
    structlog.wrap_logger(theirs, processors=[last],
                          wrapper_class=structlog.make_filtering_bound_logger(logging.INFO)).info("e", a=1)
    assert ours.calls == theirs.calls and ours.calls


def test_exception_goes_through_error_with_its_traceback() -> None:
    out = io.StringIO()
    log = structlog.wrap_logger(LineWriter(out), processors=[render_line(Clock())],
                                wrapper_class=filtering_logger(logging.INFO))
    try:
        raise ZeroDivisionError("nothing to divide")
    except ZeroDivisionError:
        log.exception("failed")
    line = json.loads(out.getvalue())
    assert line["level"] == "error" and line["event"] == "failed"
    assert "ZeroDivisionError: nothing to divide" in line["exception"]
