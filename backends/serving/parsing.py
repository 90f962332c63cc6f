"""Requests as vLLM 0.32's OpenAI server reads them.

`parse_request` turns a chat or completions JSON body into a
`GenerationRequest`, or raises `ProtocolError`, which the app renders as
vLLM's error envelope (answers.py) with vLLM's messages and status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backends.serving.answers import error_body
from backends.serving.generation import Endpoint, GenerationRequest


class ProtocolError(Exception):
    """A request the server refuses; carries vLLM's error envelope fields."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        err_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.err_type, self.status, self.param)


def parse_request(
    endpoint: Endpoint, body: Any, *, served_model: str, request_id: str
) -> GenerationRequest:
    """Validate a chat (`endpoint="chat"`) or completions body."""
    if not isinstance(body, dict):
        raise ProtocolError("The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and model != served_model:
        raise ProtocolError(
            f"The model `{model}` does not exist. Valid aliases: {served_model}.",
            status=404,
            err_type="NotFoundError",
            param="model",
        )
    messages, prompt = None, None
    if endpoint == "chat":
        messages = _messages(body.get("messages"))
        max_tokens = _optional_int(body, "max_completion_tokens", minimum=1)
        if max_tokens is None:
            max_tokens = _optional_int(body, "max_tokens", minimum=1)
    else:
        prompt = _prompt(body.get("prompt"))
        max_tokens = _optional_int(body, "max_tokens", minimum=1)
    n = _optional_int(body, "n", minimum=1)
    if n not in (None, 1):
        raise ProtocolError("Only n=1 is supported by this server.", param="n")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ProtocolError("`stream` must be a boolean.", param="stream")
    include_usage, continuous_usage = _stream_options(body.get("stream_options"), stream)
    top_k = _optional_int(body, "top_k", minimum=-1)
    return GenerationRequest(
        endpoint=endpoint,
        request_id=request_id,
        model=served_model,
        messages=messages,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=_optional_float(body, "temperature", 0.0, None),
        top_p=_optional_float(body, "top_p", 0.0, 1.0, open_low=True),
        top_k=top_k,
        seed=_optional_int(body, "seed", minimum=None),
        stop=_stop(body.get("stop")),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        body=body,
    )


def _messages(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        raise ProtocolError("`messages` must be a non-empty list.", param="messages")
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ProtocolError(
                "Each message must be an object with a string `role`.", param="messages"
            )
    return tuple(value)


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if not isinstance(value, str):
        raise ProtocolError("`prompt` must be a string.", param="prompt")
    return value


def _optional_int(body: Mapping[str, Any], name: str, *, minimum: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"`{name}` must be an integer.", param=name)
    if minimum is not None and value < minimum:
        raise ProtocolError(f"`{name}` must be at least {minimum}, got {value}.", param=name)
    return value


def _optional_float(
    body: Mapping[str, Any], name: str, low: float, high: float | None, *, open_low: bool = False
) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"`{name}` must be a number.", param=name)
    too_low = value <= low if open_low else value < low
    if too_low or (high is not None and value > high):
        bounds = f"{'(' if open_low else '['}{low}, {high if high is not None else 'inf'}]"
        raise ProtocolError(f"`{name}` must be in {bounds}, got {value}.", param=name)
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise ProtocolError("`stop` must be a string or a list of strings.", param="stop")


def _stream_options(value: Any, stream: bool) -> tuple[bool, bool]:
    if value is None:
        return False, False
    if not stream:
        raise ProtocolError(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    if not isinstance(value, dict):
        raise ProtocolError("`stream_options` must be an object.", param="stream_options")
    include_usage = bool(value.get("include_usage"))
    return include_usage, include_usage and bool(value.get("continuous_usage_stats"))
