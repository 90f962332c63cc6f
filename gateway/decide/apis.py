"""The request shapes the gateway routes, read one way.

Four endpoints reach the decision: OpenAI's chat completions and completions,
Anthropic's Messages and OpenAI's Responses. Each says the same things in its
own words; this module is where those words are read:

    endpoint      path                   prompt                          output bound         session
    chat          /v1/chat/completions   messages                        max_completion_tokens user
                                                                         (or max_tokens)
    completions   /v1/completions        prompt (text or token ids)      max_tokens           user
    messages      /v1/messages           system + messages (blocks)      max_tokens, required metadata.user_id
    responses     /v1/responses          instructions + input (items)    max_output_tokens    user

`conversation` gives chat, Messages and Responses prompts as one list of
`{"role", "content"}` turns with plain-text content, so the prompt's text
(for the domain classifier), its block hashes (for affinity) and what
capture keeps are read the same way for all three. A shape that is wrong is
a 400 naming the field; fields it does not read pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.decide.api_paths import PATHS, endpoint_of
from gateway.errors import InvalidRequest

OUTPUT_BOUNDS = {"chat": ("max_completion_tokens", "max_tokens"), "completions": ("max_tokens",),
                 "messages": ("max_tokens",), "responses": ("max_output_tokens",)}
# Anthropic's Messages API samples at 1.0 when the request names no temperature,
# whatever the backend's own default is.
API_TEMPERATURE = {"messages": 1.0}


def explained_endpoint(given: str | None, body: Mapping[str, Any]) -> str:
    """The endpoint an explain names (`messages` or `/v1/messages` alike), else
    the one the body's shape says: `input` is Responses, `prompt` without
    `messages` completions, `system` or `metadata.user_id` Messages, else chat."""
    if given:
        found = endpoint_of(given) or (given if given in PATHS else None)
        if found is None:
            raise InvalidRequest(f"'endpoint' must be one of {', '.join(PATHS)}", param="endpoint")
        return found
    if "input" in body:
        return "responses"
    if "messages" not in body and "prompt" in body:
        return "completions"
    metadata = body.get("metadata")
    if "system" in body or (isinstance(metadata, dict) and "user_id" in metadata):
        return "messages"
    return "chat"


def prompt_text(endpoint: str, body: Mapping[str, Any]) -> str | list[int]:
    """The prompt as text (token ids for a completions prompt of ids); a 400 for a wrong shape."""
    if endpoint == "completions":
        return _completion_text(body)
    if endpoint == "messages" and body.get("max_tokens") is None:
        raise InvalidRequest("'max_tokens' is required", param="max_tokens")
    return "\n".join([turn["content"] for turn in conversation(endpoint, body)])


def conversation(endpoint: str, body: Mapping[str, Any]) -> list[dict[str, str]]:
    """The prompt of a chat, Messages or Responses request as plain-text turns."""
    if endpoint == "messages":
        return _anthropic(body)
    if endpoint == "responses":
        return _responses(body)
    turns = []
    for i, message in enumerate(_turns(body, "messages")):
        content = message.get("content")  # a string, the usual case, with no error's name written for it
        turns.append({"role": _role(message),
                      "content": content if isinstance(content, str) else _text(content, f"messages[{i}].content")})
    return turns


def session_of(endpoint: str, body: Mapping[str, Any]) -> str | None:
    """The session key the request carries in its body, or None."""
    if endpoint == "messages":
        metadata = body.get("metadata")
        value = metadata.get("user_id") if isinstance(metadata, dict) else None
    else:
        value = body.get("user")
    return value if isinstance(value, str) and value else None


def _turns(body: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    turns = body.get(name)
    if not isinstance(turns, list) or not turns:
        raise InvalidRequest(f"'{name}' must be a non-empty list", param=name)
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise InvalidRequest(f"'{name}[{i}]' must be an object", param=f"{name}[{i}]")
    return turns


def _anthropic(body: Mapping[str, Any]) -> list[dict[str, str]]:
    turns = []
    system = body.get("system")
    if system is not None:
        turns.append({"role": "system", "content": _text(system, "system")})
    for i, message in enumerate(_turns(body, "messages")):
        turns.append({"role": _role(message), "content": _text(message.get("content"), f"messages[{i}].content")})
    return turns


def _responses(body: Mapping[str, Any]) -> list[dict[str, str]]:
    turns = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequest("'instructions' must be a string", param="instructions")
        turns.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        return [*turns, {"role": "user", "content": given}]
    for i, item in enumerate(_turns(body, "input")):
        content = item.get("content", item.get("output", item.get("arguments")))
        turns.append({"role": _role(item) or str(item.get("type", "")), "content": _text(content, f"input[{i}]")})
    return turns


def _role(turn: Mapping[str, Any]) -> str:
    role = turn.get("role")
    return role if isinstance(role, str) else ""


def _text(content: Any, param: str) -> str:
    """A content's text: a string, or the text of its blocks (text parts, tool
    results, tool inputs); a 400 for anything else."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"'{param}' must be a string or a list of content blocks", param=param)
    pieces = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            pieces.append(block["text"])
        elif block.get("type") == "tool_result":
            pieces.append(_text(block.get("content"), param))
        elif isinstance(block.get("input"), dict):
            pieces.append(json.dumps(block["input"], ensure_ascii=False))
    return "\n".join(pieces)


def _completion_text(body: Mapping[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "\n".join(prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return prompt
        if all(isinstance(p, list) for p in prompt):
            return [token for ids in prompt for token in ids if isinstance(token, int)]
    raise InvalidRequest("'prompt' must be a string, a list of strings or a list of token ids",
                         param="prompt")
