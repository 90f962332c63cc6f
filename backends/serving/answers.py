"""The OpenAI answers exactly as vLLM 0.32's OpenAI server writes them.

`ResponseBuilder` writes the JSON of responses and stream chunks with the same
fields, order and `null`s vLLM puts on the wire (vLLM dumps non-streaming
responses in full, stream chunks with `exclude_unset`, and the usage chunk
without `null`s). `sse` frames one event; `error_body` is vLLM's error
envelope. Reading a request is parsing.py.
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
from backends.serving.generation import Endpoint

SSE_DONE = b"data: [DONE]\n\n"


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
