"""Anthropic Messages and OpenAI Responses through the gateway's decision,
with the official clients, against fake vLLM backends on loopback that
speak both APIs as vLLM does (several tokens an event on the speculative pool)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.fakes.vllm import FakeVllm
from tests.integration.gateway.conftest import ADMIN_TOKEN, Gateway, policy_dict

CHUNKS, TOKENS = 4, 3
HI = [{"role": "user", "content": "hello"}]


@pytest.fixture
def spec_fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="upstream-spec", kind="speculative") as fake:
        fake.script(text="one two three four", chunks=CHUNKS, tokens=TOKENS, delay=0.01)
        yield fake


@pytest.fixture
def std_fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="upstream-std", kind="standard") as fake:
        fake.script(text="one two three four", chunks=CHUNKS * TOKENS)
        yield fake



OPENED: list[anthropic.Anthropic | openai.OpenAI] = []  # the clients a test made, closed after it


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    yield
    while OPENED:
        OPENED.pop().close()


def claude(gateway: Gateway) -> anthropic.Anthropic:
    OPENED.append(client := anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0))
    return client


def oai(gateway: Gateway) -> openai.OpenAI:
    OPENED.append(client := openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0))
    return client


@pytest.mark.parametrize(("temperature", "pool"), [(0.0, "speculative"), (1.5, "standard"), (None, "speculative")])
def test_messages_take_the_decision(gateway, temperature, pool):
    # this client's `create` has no temperature argument: it goes in the body; Messages' default is 1.0
    options = {} if temperature is None else {"extra_body": {"temperature": temperature}}
    raw = claude(gateway).messages.with_raw_response.create(model="any", max_tokens=64, messages=HI,
                                                            system=[{"type": "text", "text": "be brief"}], **options)
    assert raw.headers["x-specgate-pool"] == pool
    message = raw.parse()
    assert message.content[0].text == "one two three four" and message.usage.output_tokens == CHUNKS * TOKENS


def test_a_streamed_message_is_relayed_in_events_and_metered(gateway, spec_fake, measured):
    with claude(gateway).messages.stream(model="any", max_tokens=64, messages=HI, extra_body={"temperature": 0},
                                         metadata={"user_id": "u-1"}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "one two three four" and final.usage.output_tokens == CHUNKS * TOKENS
    measurement = measured.get()
    assert (measurement.pool, measurement.tokens, measurement.streamed) == ("speculative", CHUNKS * TOKENS, True)
    assert measurement.ttft_s is not None and measurement.tpot_s is not None
    sent = [r for r in spec_fake.requests if r.path == "/v1/messages"][-1]
    assert sent.body["model"] == "upstream-spec" and "stream_options" not in sent.body


def test_messages_errors_are_in_anthropics_envelope(gateway):
    with pytest.raises(anthropic.BadRequestError) as empty:
        claude(gateway).messages.create(model="any", messages=[], max_tokens=64)
    assert empty.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": "'messages' must be a non-empty list"}}
    missing = httpx.post(gateway.url + "/v1/messages", json={"model": "any", "messages": HI})
    assert missing.status_code == 400 and missing.json() == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "'max_tokens' is required"}}
    answer = httpx.post(gateway.url + "/v1/messages", content=b"{nope", headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["type"] == "error"
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_messages_upstream_failure_is_in_anthropics_envelope(start_gateway):
    gateway = start_gateway(policy_dict(["http://127.0.0.1:9"], ["http://127.0.0.1:9"]))
    with pytest.raises(anthropic.APIStatusError) as failed:
        claude(gateway).messages.create(model="any", max_tokens=64, messages=HI, extra_body={"temperature": 0})
    assert failed.value.status_code in (502, 529)
    assert failed.value.body["type"] == "error"
    assert failed.value.body["error"]["type"] in ("api_error", "overloaded_error")


@pytest.mark.parametrize(("temperature", "pool"), [(0.0, "speculative"), (1.5, "standard")])
def test_responses_take_the_decision(gateway, temperature, pool):
    raw = oai(gateway).responses.with_raw_response.create(model="any", input="hello", instructions="be brief",
                                                          temperature=temperature, max_output_tokens=64)
    assert raw.headers["x-specgate-pool"] == pool
    assert raw.parse().output_text == "one two three four"


def test_a_streamed_response_is_relayed_and_metered(gateway, measured):
    events = list(oai(gateway).responses.create(model="any", input=[{"role": "user", "content": "hello"}],
                                                temperature=0, max_output_tokens=64, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "one two three four"
    measurement = measured.get()
    assert (measurement.pool, measurement.tokens, measurement.streamed) == ("speculative", CHUNKS * TOKENS, True)


@pytest.fixture
def two_spec(start_gateway, std_fake) -> Iterator[tuple[Gateway, list[FakeVllm]]]:
    with FakeVllm(model="upstream-spec") as a, FakeVllm(model="upstream-spec") as b:
        yield start_gateway(policy_dict([a.url, b.url], [std_fake.url])), [a, b]


@pytest.mark.parametrize("stream", [False, True])
def test_a_follow_up_reaches_the_endpoint_that_holds_its_previous_response(two_spec, std_fake, stream):
    gateway, fakes = two_spec
    client = oai(gateway)
    first = client.responses.create(model="any", input="hello", temperature=0, stream=stream)
    previous = [e for e in first if e.type == "response.completed"][0].response.id if stream else first.id
    home = [f for f in fakes if any(r.path == "/v1/responses" for r in f.requests)]
    assert len(home) == 1
    for _ in range(4):  # hot sampling would go to the standard pool: the previous response pins it
        raw = client.responses.with_raw_response.create(model="any", input="more", temperature=1.5,
                                                        previous_response_id=previous)
        assert raw.headers["x-specgate-rule"] == "previous_response"
        previous = raw.parse().id
    assert sum(r.path == "/v1/responses" for r in home[0].requests) == 5
    explained = httpx.post(gateway.url + "/admin/explain", json={"input": "x", "previous_response_id": previous},
                           headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert (explained["rule"], explained["pool"], explained["home"]) == ("previous_response", "speculative",
                                                                        home[0].url)
    assert not [r for f in [*fakes, std_fake] if f is not home[0] for r in f.requests if r.path == "/v1/responses"]


def test_a_follow_up_whose_endpoint_left_the_policy_is_a_clear_404(two_spec, std_fake):
    gateway, fakes = two_spec
    client = oai(gateway)
    first = client.responses.create(model="any", input="hello", temperature=0)
    kept = [f for f in fakes if not any(r.path == "/v1/responses" for r in f.requests)]
    gateway.write_policy(policy_dict([kept[0].url], [std_fake.url]))
    reload = httpx.post(gateway.url + "/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert reload.status_code == 200
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model="any", input="more", previous_response_id=first.id)
    assert gone.value.code == "previous_response_not_found"


@pytest.mark.parametrize(("body", "endpoint", "pool"), [
    ({"max_tokens": 64, "system": "x", "messages": HI, "temperature": 0}, "messages", "speculative"),
    ({"input": "hello", "temperature": 1.5}, "responses", "standard"),
])
def test_explain_reads_every_shape(gateway, body, endpoint, pool):
    answer = httpx.post(gateway.url + "/admin/explain", json=body,
                        headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert answer["features"]["endpoint"] == endpoint and answer["pool"] == pool


def test_a_cut_message_stream_ends_with_an_anthropic_error_event(gateway, spec_fake):
    spec_fake.cut_stream(after_events=3)
    with pytest.raises(anthropic.APIStatusError) as cut:
        with claude(gateway).messages.stream(model="any", max_tokens=64, messages=HI,
                                             extra_body={"temperature": 0}) as stream:
            list(stream.text_stream)
    assert cut.value.body["type"] == "error" and cut.value.body["error"]["type"] == "api_error"


def test_a_cut_response_stream_ends_with_a_responses_error_event(gateway, spec_fake):
    spec_fake.cut_stream(after_events=3)
    with httpx.stream("POST", gateway.base_url + "/responses",
                      json={"input": "hi", "temperature": 0, "stream": True}) as answer:
        body = b"".join(answer.iter_bytes())
    assert body.startswith(b"event: response.created") and body.endswith(b"\n\n")
    assert b'event: error\ndata: {"type": "error", "code": "upstream_unreachable"' in body


@pytest.mark.parametrize(("queue", "status", "kind"), [({"max_waiting": 0}, 429, "rate_limit_error"),
                                                       ({"max_wait_s": 0.05}, 529, "overloaded_error")])
def test_the_gateways_own_refusals_are_in_anthropics_envelope(start_gateway, std_fake, queue, status, kind):
    policy = {**policy_dict([std_fake.url], [std_fake.url], max_in_flight=1, queue=queue),
              "rules": [{"name": "all", "route": "standard"}]}
    gateway = start_gateway(policy)
    pool = gateway.app.state.runtime.pools["standard"]
    std_fake.hold()

    async def main() -> anthropic.APIStatusError:
        client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="k", max_retries=0)
        held = asyncio.create_task(client.messages.create(model="m", max_tokens=64, messages=HI))
        while pool.in_flight < 1 and not held.done():
            await asyncio.sleep(0.01)
        with pytest.raises(anthropic.APIStatusError) as refused:
            await client.messages.create(model="m", max_tokens=64, messages=HI)
        std_fake.release()
        await held
        await client.close()
        return refused.value

    try:
        error = asyncio.run(main())
    finally:
        std_fake.release()
    assert error.status_code == status and error.response.headers["retry-after"]
    assert error.body["type"] == "error" and error.body["error"]["type"] == kind


def test_the_latency_model_learns_from_streamed_messages_and_responses(gateway, measured):
    model = gateway.app.state.parts.latency
    assert not model.snapshot()["pairs"]
    with claude(gateway).messages.stream(model="any", max_tokens=64, messages=HI,
                                         extra_body={"temperature": 0}) as stream:
        stream.until_done()
    list(oai(gateway).responses.create(model="any", input="hello", temperature=1.5, stream=True))
    learned = {measured.get().pool, measured.get().pool}  # both measured, after the model's own sink
    assert learned == {"speculative", "standard"}
    assert {pair["pool"] for pair in model.snapshot()["pairs"]} == learned
