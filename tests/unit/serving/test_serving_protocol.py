"""The JSON the serving layer writes equals vLLM 0.32's, field for field and in
the same order. The expected objects were written by vLLM's own protocol
classes (vllm_wire_samples.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.serving.answers import ResponseBuilder, error_body, model_list, sse, usage
from backends.serving.generation import Endpoint, GenerationRequest
from backends.serving.parsing import ProtocolError, parse_request

SAMPLES = json.loads((Path(__file__).parent / "vllm_wire_samples.json").read_text())


def same(ours: dict, theirs: dict) -> None:
    """Equal values and equal key order (json.dumps keeps insertion order)."""
    assert json.dumps(ours) == json.dumps(theirs)


@pytest.fixture
def chat() -> ResponseBuilder:
    return ResponseBuilder("chat", "M", "X", created=1)


@pytest.fixture
def cmpl() -> ResponseBuilder:
    return ResponseBuilder("completions", "M", "X", created=1)


def test_chat_stream_chunks_match_vllm(chat: ResponseBuilder) -> None:
    same(chat.first_chunk(), SAMPLES["chat_first"])
    same(chat.chunk("hi"), SAMPLES["chat_mid"])
    same(chat.chunk("!", "length"), SAMPLES["chat_last"])
    same(chat.usage_chunk(5, 3), SAMPLES["chat_usage"])
    same(chat.chunk("hi", running_usage=usage(5, 1)), SAMPLES["chat_cont_usage"])


def test_chat_response_matches_vllm(chat: ResponseBuilder) -> None:
    same(chat.response("hi!", "stop", 5, 3), SAMPLES["chat_full"])


def test_completion_objects_match_vllm(cmpl: ResponseBuilder) -> None:
    assert cmpl.first_chunk() is None  # completions streams have no role chunk
    same(cmpl.chunk("hi"), SAMPLES["cmpl_mid"])
    same(cmpl.chunk("!", "length"), SAMPLES["cmpl_last"])
    same(cmpl.usage_chunk(5, 3), SAMPLES["cmpl_usage"])
    same(cmpl.response("hi!", "length", 5, 3), SAMPLES["cmpl_full"])


def test_error_and_model_list_match_vllm() -> None:
    same(error_body("bad n"), SAMPLES["error"])
    ours = model_list("M", root="/path", max_model_len=2048, created=0)
    theirs = SAMPLES["models"]
    for listing in (ours, theirs):
        for card in listing["data"]:
            card["created"] = 0
            for permission in card["permission"]:
                permission["created"], permission["id"] = 0, permission["id"][:10]
    same(ours, theirs)


def test_sse_framing() -> None:
    assert sse({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()


def test_ids_use_the_request_id_with_vllm_prefixes() -> None:
    assert ResponseBuilder("chat", "M", "abc").id == "chatcmpl-abc"
    assert ResponseBuilder("completions", "M", "abc").id == "cmpl-abc"


def parse(endpoint: Endpoint, body: object) -> GenerationRequest:
    return parse_request(endpoint, body, served_model="M", request_id="r1")


def test_parse_chat_request_fields() -> None:
    request = parse(
        "chat",
        {
            "model": "M",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": -1,
            "stop": "x",
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "logprobs": True,
        },
    )
    assert (request.max_tokens, request.temperature, request.top_p, request.top_k) == (7, 0.0, 0.5, -1)
    assert request.stop == ("x",) and request.seed == 3
    assert request.stream and request.include_usage and request.continuous_usage
    assert request.prompt_text() == "hi"


def test_parse_completion_defaults_stay_unset() -> None:
    request = parse("completions", {"prompt": ["once"]})
    assert request.prompt == "once" and request.prompt_text() == "once"
    assert request.max_tokens is request.temperature is request.top_p is None
    assert not request.stream and not request.include_usage


@pytest.mark.parametrize(
    ("endpoint", "body", "param", "status"),
    [
        ("chat", [], None, 400),
        ("chat", {"messages": []}, "messages", 400),
        ("chat", {"messages": [{"content": "no role"}]}, "messages", 400),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "n": 2}, "n", 400),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens", 400),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature", 400),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature", 400),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p", 400),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop", 400),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream", 400),
        (
            "chat",
            {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}},
            "stream_options",
            400,
        ),
        ("chat", {"model": "other", "messages": [{"role": "user", "content": "x"}]}, "model", 404),
        ("completions", {"prompt": 5}, "prompt", 400),
        ("completions", {}, "prompt", 400),
    ],
)
def test_parse_rejects_bad_input_with_vllm_errors(endpoint, body, param, status) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(endpoint, body)
    envelope = caught.value.body()["error"]
    assert set(envelope) == {"message", "type", "param", "code"}
    assert envelope["param"] == param and envelope["code"] == status == caught.value.status
    assert envelope["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
