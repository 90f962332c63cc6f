"""Reading what the router knows about a request, its `Features`
(gateway/policy/features.py), from its body and the live load, and the
parsing that turns a raw body into them.

Parsing is strict about types (a wrong type is a 400 naming the field) and
lenient about everything it does not read: unknown fields pass through to
the backend untouched. `check_limits` bounds the fields that multiply the
work one request asks of a backend.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from gateway.decide import apis
from gateway.decide.json_body import JsonBody, loads
from gateway.errors import InvalidRequest
from gateway.policy.features import Defaults, Features

CHARS_PER_TOKEN = 4  # rough BPE average for English text and code
_PLAIN_TEXT: tuple[Any, ...] = (None, {}, {"type": "text"})  # `response_format` values that ask for nothing


class Limits:
    """What one request may ask for (a plain class: built per request, its `__init__` compiled)."""

    def __init__(self, n: int = 16, max_tokens: int = 131072) -> None:
        self.n = n  # sequences per request: `n`, and `best_of` where a backend still takes it
        self.max_tokens = max_tokens  # output tokens: `max_tokens`, `max_completion_tokens`, `max_output_tokens`


def check_limits(body: Mapping[str, Any], limits: Limits) -> None:
    """A 400 naming the first field over its limit (or of the wrong type)."""
    for name, limit in (("n", limits.n), ("best_of", limits.n), ("max_tokens", limits.max_tokens),
                        ("max_completion_tokens", limits.max_tokens),
                        ("max_output_tokens", limits.max_tokens)):
        value = _field(body, name, _positive_int)
        if value is not None and value > limit:
            raise InvalidRequest(f"'{name}' is {value}, over the limit of {limit}", param=name)


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """Decode a request body into a JSON object, or raise a 400 that says why."""
    body: dict[str, Any] = parse_json(raw).value
    return body


def parse_json(raw: bytes) -> JsonBody:
    """A request body's JSON object and where its top-level values lie in its
    text (to send it on changed without serialising it again), or a 400 that says why."""
    try:
        parsed = loads(raw, _DECODER)
    except UnicodeDecodeError:
        raise InvalidRequest("request body is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                             f"column {exc.colno}") from None
    except RecursionError:
        raise InvalidRequest("request body is nested too deeply") from None
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if not isinstance(parsed.value, dict):
        raise InvalidRequest("request body must be a JSON object")
    return parsed


def _reject_constant(name: str) -> Any:
    raise ValueError(f"request body contains {name}, which is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)  # immutable: safe to share, as a compiled pattern


def extract_features(
    body: Mapping[str, Any],
    endpoint: str,
    defaults: Defaults,
    classify: Callable[[str], str],
    load: Mapping[str, int],
    domain_override: str | None = None,
    route_override: str | None = None,
) -> Features:
    prompt = apis.prompt_text(endpoint, body)
    prompt_text = prompt if isinstance(prompt, str) else ""
    prompt_tokens = (len(prompt) if isinstance(prompt, list)
                     else math.ceil(len(prompt_text) / CHARS_PER_TOKEN))
    max_tokens = None
    for name in apis.OUTPUT_BOUNDS[endpoint]:
        max_tokens = _field(body, name, _positive_int)
        if max_tokens is not None:
            break
    get = body.get
    return Features(  # by position, in the fields' order: keywords cost a request 1.5 us more
        endpoint,
        _field(body, "model", _string),
        _field(body, "temperature", _non_negative, apis.API_TEMPERATURE.get(endpoint, defaults.temperature)),
        _field(body, "top_p", _non_negative, defaults.top_p),
        defaults.max_tokens if max_tokens is None else max_tokens,
        _field(body, "stream", _boolean, False),
        _field(body, "n", _positive_int, 1),
        len(prompt_text),  # prompt_chars
        prompt_tokens,
        bool(get("tools")) or bool(get("functions")),  # tools
        get("response_format") not in _PLAIN_TEXT,  # response_format
        bool(get("logprobs")) or bool(get("top_logprobs")),  # logprobs
        domain_override or classify(prompt_text),  # domain
        route_override,
        load,
    )


def _field(body: Mapping[str, Any], name: str, check: Callable[[str, Any], Any], default: Any = None) -> Any:
    """`body[name]` checked, or `default` where it is absent or null."""
    value = body.get(name)
    return default if value is None else check(name, value)


def _string(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string", param=name)
    return value


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be a boolean", param=name)
    return value


def _number_at_least(low: float) -> Callable[[str, Any], float]:
    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidRequest(f"'{name}' must be a number", param=name)
        if not math.isfinite(value) or value < low:
            raise InvalidRequest(f"'{name}' must be a finite number >= {low}", param=name)
        return float(value)
    return check


def _int_at_least(low: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(f"'{name}' must be an integer", param=name)
        if value < low:
            raise InvalidRequest(f"'{name}' must be >= {low}", param=name)
        return value
    return check


_positive_int = _int_at_least(1)
_non_negative = _number_at_least(0.0)
