"""The JSON log line: one object per line, its level, a UTC timestamp, tracebacks, any value."""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
import structlog

from gateway.log_line import Clock, render_line

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def logger(out: io.StringIO) -> Any:
    return structlog.wrap_logger(structlog.WriteLogger(out), processors=[render_line(Clock())],
                                 wrapper_class=structlog.make_filtering_bound_logger(0))


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_line_keeps_its_fields_in_order_then_event_level_and_timestamp() -> None:
    out = io.StringIO()
    before = datetime.now(timezone.utc)
    logger(out).info("request", request_id="r1", status=200, duration=0.0031, pool="spéc")
    after = datetime.now(timezone.utc)
    [line] = lines(out)
    assert list(line) == ["request_id", "status", "duration", "pool", "event", "level", "timestamp"]
    assert line["pool"] == "spéc" and line["level"] == "info" and line["event"] == "request"
    stamp = str(line["timestamp"])
    assert STAMP.match(stamp)
    assert before.replace(microsecond=0) <= datetime.fromisoformat(stamp.replace("Z", "+00:00")) <= after


def test_the_levels_are_structlogs_names() -> None:
    out = io.StringIO()
    log = logger(out)
    log.warn("a")
    log.warning("b")
    log.error("c")
    try:
        raise ZeroDivisionError("nothing to divide")
    except ZeroDivisionError:
        log.exception("d")
    assert [line["level"] for line in lines(out)] == ["warning", "warning", "error", "error"]
    assert "ZeroDivisionError: nothing to divide" in str(lines(out)[-1]["exception"])


def test_a_value_json_lacks_is_written_as_its_repr_and_a_line_never_breaks() -> None:
    out = io.StringIO()
    logger(out).info("odd", what=object, text="two\nlines", big=10**30)
    [line] = lines(out)
    assert line["what"] == repr(object) and line["text"] == "two\nlines" and line["big"] == 10**30


def test_what_the_fast_encoder_cannot_write_the_standard_one_writes() -> None:
    out = io.StringIO()
    log = logger(out)
    log.info("keys", counts={1: "one"}, big=-(2**70))
    log.info("surrogate", text="half \ud800 a pair")
    first, second = lines(out)
    assert first["counts"] == {"1": "one"} and first["big"] == -(2**70)
    assert second["text"] == "half \ud800 a pair"


def test_a_line_is_strict_json_in_utf8_and_a_dataclass_or_datetime_is_its_repr() -> None:
    @dataclass
    class Point:
        x: int

    out = io.StringIO()
    moment = datetime(2026, 1, 2, tzinfo=timezone.utc)
    logger(out).info("odd", ratio=float("nan"), pool="spéc", point=Point(1), at=moment)
    text = out.getvalue()
    assert "spéc" in text  # written as UTF-8, not escaped

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    line = json.loads(text, parse_constant=refuse)
    assert line["ratio"] is None and line["point"] == repr(Point(1)) and line["at"] == repr(moment)


def test_the_clock_formats_each_second_once_and_its_microseconds_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, formatted = Clock(), []
    strftime = time.strftime

    def counted(*args: Any) -> str:
        formatted.append(args)
        return strftime(*args)

    monkeypatch.setattr("gateway.log_line.time.strftime", counted)
    monkeypatch.setattr("gateway.log_line.time.time_ns", lambda: 1_795_766_883_000_042_999)
    assert clock() == "2026-11-27T08:08:03.000042Z"
    monkeypatch.setattr("gateway.log_line.time.time_ns", lambda: 1_795_766_883_999_999_999)
    assert clock() == "2026-11-27T08:08:03.999999Z"
    monkeypatch.setattr("gateway.log_line.time.time_ns", lambda: 1_795_766_884_250_000_000)
    assert clock() == "2026-11-27T08:08:04.250000Z"
    assert len(formatted) == 2
