"""The OpenAI wire format exactly as vLLM 0.32's OpenAI server writes it.

Parsing turns a JSON body into a `GenerationRequest` or raises `ProtocolError`
(rendered as vLLM's error envelope). `ResponseBuilder` writes the JSON of
responses and stream chunks with the same fields, order and `null`s vLLM puts
on the wire (vLLM dumps non-streaming responses in full, stream chunks with
`exclude_unset`, and the usage chunk without `null`s). `sse` frames one event.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.serving.acceptance import whole_metrics
from backends.serving.generation import Endpoint, GenerationRequest

SSE_DONE = b"data: [DONE]\n\n"


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


def error_body(
    message: str, err_type: str = "BadRequestError", status: int = 400, param: str | None = None
) -> dict[str, Any]:
    """vLLM's `ErrorResponse`: `code` is the HTTP status as an integer."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def random_id() -> str:
    """16 hex digits, the shape of vLLM's `random_uuid()`."""
    return f"{uuid.uuid4().int & (2**64 - 1):016x}"


def sse(payload: Mapping[str, Any]) -> bytes:
    """One server-sent event, framed like vLLM: `data: {json}\\n\\n`."""
    return b"data: " + dumps(payload) + b"\n\n"


def dumps(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


# ---------------------------------------------------------------- parsing


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


# ---------------------------------------------------------------- responses


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """vLLM's `UsageInfo` field order (the usage chunk drops its `null`s)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


@dataclass
class ResponseBuilder:
    """Writes every JSON object of one response; `id` and `created` are shared
    by all its chunks, as in vLLM. The id is `chatcmpl-`/`cmpl-` followed by
    the client's `X-Request-Id` when it sent one, else a random id.
    `system_fingerprint` goes where vLLM puts it: in whole responses, and in
    a stream's last chunk (the usage chunk when there is one)."""

    endpoint: Endpoint
    model: str
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    system_fingerprint: str | None = None

    @property
    def id(self) -> str:
        prefix = "chatcmpl-" if self.endpoint == "chat" else "cmpl-"
        return prefix + self.request_id

    def _envelope(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}

    # Streaming -------------------------------------------------------------

    def first_chunk(self, running_usage: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Chat streams open with an empty assistant delta; completions don't."""
        if self.endpoint != "chat":
            return None
        chunk = self._envelope("chat.completion.chunk")
        chunk["choices"] = [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        self._add_running_usage(chunk, running_usage)
        chunk["prompt_token_ids"] = None
        chunk["prompt_text"] = None
        return chunk

    def chunk(
        self,
        text: str,
        finish_reason: str | None = None,
        running_usage: dict[str, Any] | None = None,
        *,
        last: bool = False,
    ) -> dict[str, Any]:
        """A content chunk; the final one carries `finish_reason` (and vLLM's
        `stop_reason`). `running_usage` is sent with `continuous_usage_stats`;
        `last` marks the stream's last chunk (no usage chunk follows)."""
        if self.endpoint == "chat":
            chunk = self._envelope("chat.completion.chunk")
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            if finish_reason is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = None
        else:
            chunk = self._envelope("text_completion")
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        chunk["choices"] = [choice]
        self._add_running_usage(chunk, running_usage)
        if last and finish_reason is not None and self.system_fingerprint is not None:
            chunk["system_fingerprint"] = self.system_fingerprint
        return chunk

    def _add_running_usage(self, chunk: dict[str, Any], running: dict[str, Any] | None) -> None:
        if running is not None:
            extra = {"completion_tokens_details": None} if self.endpoint == "chat" else {}
            chunk["usage"] = {**running, **extra}

    def usage_chunk(
        self, prompt_tokens: int, completion_tokens: int, metrics: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The chunk after the last choice when `stream_options.include_usage`;
        the answer's per-request `metrics` ride on it (vLLM drops its `null`s)."""
        object_name = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        chunk = self._envelope(object_name)
        chunk["choices"] = []
        chunk["usage"] = usage(prompt_tokens, completion_tokens)
        if self.system_fingerprint is not None:
            chunk["system_fingerprint"] = self.system_fingerprint
        if metrics is not None:
            chunk["metrics"] = metrics
        return chunk

    # Non-streaming ---------------------------------------------------------

    def response(
        self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int,
        metrics: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A whole `chat.completion` or `text_completion` object; `metrics`
        is written in full, every unset field `null`, as vLLM dumps it."""
        full_usage = {
            **usage(prompt_tokens, completion_tokens),
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }
        if self.endpoint == "chat":
            body = self._envelope("chat.completion")
            body["choices"] = [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                    "token_ids": None,
                    "routed_experts": None,
                }
            ]
            tail: dict[str, Any] = {
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
            }
        else:
            body = self._envelope("text_completion")
            body["choices"] = [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                    "routed_experts": None,
                }
            ]
            tail = {}
        body.update(
            service_tier=None, system_fingerprint=self.system_fingerprint, usage=full_usage
        )
        body.update(tail)
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=whole_metrics(metrics))
        return body



def system_fingerprint(model: str, version: str = "0.32.0") -> str:
    """A fingerprint shaped like vLLM's default (`vllm-<version>-<hash8>`),
    stable for a served model name."""
    return f"vllm-{version}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def model_list(model: str, *, root: str | None, max_model_len: int | None, created: int) -> dict:
    """`GET /v1/models` as vLLM answers it for one served model."""
    permission = {
        "id": f"modelperm-{random_id()}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root if root is not None else model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}
