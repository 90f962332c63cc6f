"""Anthropic Messages and OpenAI Responses, served the way vLLM serves them:
the request becomes a chat request, and the chat answer (whole, or its
stream with usage) becomes the API's answer.

Messages streams are framed `event: <type>` + `data: <json>`:
`message_start` (input tokens), `content_block_start`, one
`content_block_delta` per chat chunk (several tokens on a speculative
engine), `content_block_stop`, `message_delta` (stop reason and output
tokens), `message_stop` (no `[DONE]` in vLLM 0.32). Responses streams:
`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta` per chunk, the
`.done` events, `response.completed` with usage. Responses are stored in
memory (as vLLM does with its store on), so `previous_response_id` continues
one, and an unknown id is a 404.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from backends.serving.answers import dumps, random_id
from backends.serving.parsing import ProtocolError

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def event(kind: str, payload: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + dumps(payload) + b"\n\n"


def anthropic_error(exc: ProtocolError) -> dict[str, Any]:
    kind = {404: "not_found_error"}.get(exc.status, "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def messages_to_chat(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError("The request body must be a JSON object.")
    if not isinstance(body.get("max_tokens"), int):
        raise ProtocolError("max_tokens: Field required", param="max_tokens")
    if not isinstance(body.get("messages"), list):
        raise ProtocolError("messages: Field required", param="messages")
    turns = [] if body.get("system") is None else [{"role": "system", "content": _text(body["system"])}]
    turns += [{"role": m.get("role", "user"), "content": _text(m.get("content"))}
              for m in body["messages"] if isinstance(m, dict)]
    return _chat(body, turns, body["max_tokens"])


def _chat(body: Mapping[str, Any], turns: list[dict[str, Any]], max_tokens: Any) -> dict[str, Any]:
    chat = {"messages": turns, "stream": bool(body.get("stream")),
            "stream_options": {"include_usage": True} if body.get("stream") else None}
    for name in ("model", "temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    return {k: v for k, v in chat.items() if v is not None}


def _chunks(lines: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any] | None]:
    """The chat stream's chunks; None for its [DONE]."""
    async def parsed() -> AsyncIterator[dict[str, Any] | None]:
        async for raw in lines:
            data = raw.removeprefix(b"data: ").strip()
            yield None if data == b"[DONE]" else json.loads(data)
    return parsed()


def whole_message(chat: dict[str, Any]) -> dict[str, Any]:
    choice, usage = chat["choices"][0], chat["usage"]
    return {"id": chat["id"], "type": "message", "role": "assistant", "model": chat["model"],
            "content": [{"type": "text", "text": choice["message"]["content"] or ""}],
            "stop_reason": STOP_REASONS.get(choice["finish_reason"], "end_turn"), "stop_sequence": None,
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}}


async def message_events(chat: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """vLLM's order: `message_start` for the first chunk (the role), a text block
    opened at the first text, `message_delta` with the usage chunk's counts,
    `message_stop` for the chat stream's [DONE] (which is not passed on)."""
    started = opened = False
    finish = "stop"
    async for chunk in _chunks(chat):
        if chunk is None:
            yield event("message_stop", {"type": "message_stop"})
        elif "error" in chunk:
            failure = {"type": "api_error", "message": chunk["error"]["message"]}
            yield event("error", {"type": "error", "error": failure})
        elif not started:
            started = True
            message = {**whole_message({**chunk, "choices": [{"message": {"content": ""}, "finish_reason": None}],
                                        "usage": {"prompt_tokens": 0, "completion_tokens": 0}}),
                       "content": [], "stop_reason": None}
            yield event("message_start", {"type": "message_start", "message": message})
        elif not chunk["choices"]:
            usage = chunk["usage"]
            if opened:
                yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield event("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": STOP_REASONS.get(finish, "end_turn"),
                                                    "stop_sequence": None},
                                          "usage": {"input_tokens": usage["prompt_tokens"],
                                                    "output_tokens": usage["completion_tokens"]}})
        else:
            choice = chunk["choices"][0]
            finish = choice.get("finish_reason") or finish
            text = (choice.get("delta") or {}).get("content")
            if text and not opened:
                opened = True
                yield event("content_block_start", {"type": "content_block_start", "index": 0,
                                                    "content_block": {"type": "text", "text": ""}})
            if text:
                yield event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                    "delta": {"type": "text_delta", "text": text}})


class ResponsesStore:
    """The Responses a server answered, by id, and their translation."""

    def __init__(self) -> None:
        self.stored: dict[str, list[dict[str, Any]]] = {}  # id -> the conversation up to and with it

    def to_chat(self, body: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        if not isinstance(body, dict):
            raise ProtocolError("The request body must be a JSON object.")
        turns = [] if body.get("instructions") is None else [{"role": "system", "content": body["instructions"]}]
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in self.stored:
                raise ProtocolError(f"Response with id '{previous}' not found.", status=404,
                                    err_type="invalid_request_error", param="previous_response_id")
            turns += self.stored[previous]
        given = body.get("input")
        if isinstance(given, str):
            turns.append({"role": "user", "content": given})
        elif isinstance(given, list):
            turns += [{"role": item.get("role", "user"), "content": _text(item.get("content"))}
                      for item in given if isinstance(item, dict)]
        else:
            raise ProtocolError("input: Field required", param="input")
        return _chat(body, turns, body.get("max_output_tokens")), turns

    def response(self, rid: str, model: str, text: str, status: str, usage: dict[str, int] | None,
                 turns: list[dict[str, Any]]) -> dict[str, Any]:
        item = {"id": "msg_" + rid[5:], "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
        if status == "completed":
            self.stored[rid] = [*turns, {"role": "assistant", "content": text}]
        return {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
                "status": status, "output": [item] if status == "completed" else [], "error": None,
                "incomplete_details": None, "instructions": None, "metadata": {}, "parallel_tool_calls": True,
                "temperature": None, "tool_choice": "auto", "tools": [], "top_p": None,
                "text": {"format": {"type": "text"}},
                "usage": None if usage is None else {
                    "input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}}

    def whole(self, chat: dict[str, Any], turns: list[dict[str, Any]]) -> dict[str, Any]:
        rid = f"resp_{random_id()}"
        return self.response(rid, chat["model"], chat["choices"][0]["message"]["content"] or "", "completed",
                             chat["usage"], turns)

    async def events(self, chat: AsyncIterator[bytes], model: str,
                     turns: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        rid = f"resp_{random_id()}"
        item_id, seq, text = "msg_" + rid[5:], 0, []

        def numbered(kind: str, payload: dict[str, Any]) -> bytes:
            nonlocal seq
            seq += 1
            return event(kind, {"type": kind, "sequence_number": seq - 1, **payload})

        yield numbered("response.created", {"response": self.response(rid, model, "", "in_progress", None, turns)})
        yield numbered("response.in_progress", {"response": self.response(rid, model, "", "in_progress", None, turns)})
        item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        yield numbered("response.output_item.added", {"output_index": 0, "item": item})
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        yield numbered("response.content_part.added", {**where, "part": part})
        async for chunk in _chunks(chat):
            if chunk is None:
                continue
            if "error" in chunk:
                yield numbered("error", {"code": "server_error", "message": chunk["error"]["message"], "param": None})
                continue
            if chunk["choices"]:
                delta = (chunk["choices"][0].get("delta") or {}).get("content")
                if delta:
                    text.append(delta)
                    yield numbered("response.output_text.delta", {**where, "delta": delta, "logprobs": []})
                continue
            done = self.response(rid, model, "".join(text), "completed", chunk["usage"], turns)
            yield numbered("response.output_text.done", {**where, "text": "".join(text), "logprobs": []})
            yield numbered("response.content_part.done", {**where, "part": {**part, "text": "".join(text)}})
            yield numbered("response.output_item.done", {"output_index": 0, "item": done["output"][0]})
            yield numbered("response.completed", {"response": done})
