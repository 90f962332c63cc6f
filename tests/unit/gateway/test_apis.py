"""Reading Messages and Responses requests, their envelopes, their usage, and where their answers live."""

from __future__ import annotations

import pytest

from gateway.decide import apis
from gateway.decide.features import extract_features
from gateway.errors import AtCapacity, InvalidRequest, PayloadTooLarge, Shed, UpstreamTimeout, UpstreamUnreachable
from gateway.policy.features import Defaults
from gateway.upstream.response_homes import ResponseHomes
from gateway.upstream.usage import UsagePlan


def features(endpoint: str, **body):
    return extract_features(body, endpoint, Defaults(temperature=0.7), lambda text: "code" if "def " in text
                            else "general", {})


def test_a_message_reads_system_blocks_tools_and_its_own_default_temperature():
    found = features("messages", max_tokens=40, system=[{"type": "text", "text": "You write code."}],
                     messages=[{"role": "user", "content": [{"type": "text", "text": "def add(a, b):"},
                                                            {"type": "tool_result", "tool_use_id": "t",
                                                             "content": "ok"}]}],
                     tools=[{"name": "run", "input_schema": {}}], stream=True)
    assert (found.endpoint, found.temperature, found.max_tokens, found.tools, found.stream, found.domain) == \
        ("messages", 1.0, 40, True, True, "code")
    assert found.prompt_chars == len("You write code.\ndef add(a, b):\nok")


def test_a_message_without_max_tokens_is_a_400():
    with pytest.raises(InvalidRequest, match="'max_tokens' is required"):
        features("messages", messages=[{"role": "user", "content": "hi"}])


def test_a_response_reads_instructions_input_items_and_max_output_tokens():
    found = features("responses", instructions="be brief", max_output_tokens=12, temperature=0,
                     input=[{"role": "user", "content": [{"type": "input_text", "text": "def f():"}]},
                            {"type": "function_call_output", "call_id": "c", "output": "42"}])
    assert (found.temperature, found.max_tokens, found.domain) == (0.0, 12, "code")
    assert apis.conversation("responses", {"input": "hi"}) == [{"role": "user", "content": "hi"}]
    assert features("responses", input="hi").temperature == 0.7  # the policy's default, as for chat


@pytest.mark.parametrize(("body", "param"), [({"input": 3}, "input"), ({"input": "x", "instructions": 1},
                                                                      "instructions")])
def test_a_response_of_the_wrong_shape_is_a_400_naming_the_field(body, param):
    with pytest.raises(InvalidRequest) as bad:
        apis.prompt_text("responses", body)
    assert bad.value.param == param


def test_the_session_of_a_message_is_its_metadata_user_id():
    assert apis.session_of("messages", {"metadata": {"user_id": "u-1"}}) == "u-1"
    assert apis.session_of("responses", {"user": "u-2"}) == "u-2"
    assert apis.session_of("messages", {"user": "u-3"}) is None


@pytest.mark.parametrize(("error", "status", "kind"), [
    (InvalidRequest("x"), 400, "invalid_request_error"),
    (PayloadTooLarge("x"), 413, "request_too_large"),
    (Shed("x"), 429, "rate_limit_error"),
    (AtCapacity("x"), 529, "overloaded_error"),
    (UpstreamUnreachable("x"), 502, "api_error"),
    (UpstreamTimeout("x"), 504, "api_error"),
])
def test_errors_on_messages_take_anthropics_envelope_and_status(error, status, kind):
    assert error.answer("messages") == (status, {"type": "error", "error": {"type": kind, "message": "x"}})
    assert error.answer("responses") == (error.status_code, error.body())


def test_messages_and_responses_ask_nothing_and_read_output_tokens_as_they_pass():
    for endpoint, events in (
        ("messages", [b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
                      b'{"input_tokens":3,"output_tokens":0}}}\n\n',
                      b'event: content_block_delta\ndata: {"delta":{"text":"\\"output_tokens\\": 99"}}\n\n',
                      b'event: message_delta\ndata: {"usage":{"output_tokens":7}}\n\n',
                      b'event: message_stop\ndata: {"type":"message_stop"}\n\n']),
        ("responses", [b'event: response.created\ndata: {"response":{"id":"resp_abc","usage":null}}\n\n',
                       b'event: response.completed\ndata: {"response":{"id":"resp_abc","usage":'
                       b'{"input_tokens":3,"output_tokens":7,"output_tokens_details":{}}}}\n\n']),
    ):
        plan = UsagePlan(endpoint, {"stream": True}, stream=True)
        assert plan.asks({"stream": True}, paced=True) == {}
        tap = plan.tap()
        assert b"".join(tap.feed(run) for run in events) == b"".join(events)  # nothing removed
        assert tap.tokens() == 7 and plan.ended(events[-1])
    assert tap.response_id == "resp_abc"


def test_a_chat_stream_plan_asks_for_the_usage_it_hides():
    plan = UsagePlan("chat", {"stream": True}, stream=True)
    assert plan.asks({"stream": True}, paced=False) == {"stream_options": {"include_usage": True}}
    assert plan.asks({"stream": True}, paced=True) == {
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def test_the_stream_error_event_follows_each_api():
    error = UpstreamTimeout("late")
    assert UsagePlan("messages").stream_error(error).startswith(b'event: error\ndata: {"type": "error", "error"')
    assert UsagePlan("responses").stream_error(error).startswith(b'event: error\ndata: {"type": "error", "code"')
    assert UsagePlan("chat").stream_error(error).startswith(b'data: {"error"')


def test_response_homes_are_an_lru_bounded_by_count():
    homes = ResponseHomes(size=2)
    homes.remember("resp_1", "a", "http://one")
    homes.remember("resp_2", "a", "http://two")
    assert homes.find("resp_1") == ("a", "http://one")  # now the most recent
    homes.remember("resp_3", "b", "http://three")
    assert homes.find("resp_2") is None and len(homes) == 2


@pytest.mark.parametrize(("given", "body", "endpoint"), [
    (None, {"input": "hi"}, "responses"),
    (None, {"prompt": "hi"}, "completions"),
    (None, {"system": "x", "messages": [], "max_tokens": 5}, "messages"),
    (None, {"messages": []}, "chat"),
    ("/v1/messages", {"messages": []}, "messages"),
    ("responses", {"messages": []}, "responses"),
])
def test_explain_reads_the_endpoint_given_or_the_bodys_shape(given, body, endpoint):
    assert apis.explained_endpoint(given, body) == endpoint


def test_explain_refuses_an_unknown_endpoint():
    with pytest.raises(InvalidRequest, match="'endpoint' must be one of"):
        apis.explained_endpoint("embeddings", {})
