"""The gateway as a drop-in OpenAI proxy, against fake vLLM servers on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from gateway.edge.http_protocol import with_header_timeout
from tests.fakes.raw_sse import RawSseBackend
from tests.fakes.vllm import FakeVllm
from tests.fakes.waiting import wait_until

from .conftest import Gateway, policy_dict

GREEDY = {"temperature": 0, "max_tokens": 128}
MESSAGES = [{"role": "user", "content": "Tell me about rivers."}]


def client(gateway, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="client-key", max_retries=0, **kwargs)


def test_non_stream_chat_with_the_openai_client(gateway, spec_fake):
    spec_fake.script(text="Rivers carve valleys.", chunks=3)
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="smollm2", messages=MESSAGES, extra_headers={"x-request-id": "req-123"}, **GREEDY)
    completion = raw.parse()
    assert completion.choices[0].message.content == "Rivers carve valleys."
    assert raw.headers["x-specgate-pool"] == "speculative"
    assert raw.headers["x-specgate-rule"] == "default"
    assert raw.headers["x-request-id"] == "req-123"
    upstream = spec_fake.completion_requests()[-1]
    assert upstream.body["model"] == "upstream-spec"  # rewritten for the pool
    assert upstream.headers["x-request-id"] == "req-123"


def test_stream_chat_with_the_openai_client(gateway, std_fake):
    std_fake.script(text="one two three four", chunks=4)
    with client(gateway).chat.completions.with_streaming_response.create(
            model="smollm2", messages=MESSAGES, temperature=1.5, max_tokens=100, stream=True) as response:
        assert response.headers["x-specgate-pool"] == "standard"
        assert response.headers["x-specgate-rule"] == "hot-sampling"
        assert response.headers["x-request-id"]
        text = "".join(chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices)
    assert text == "one two three four"


def test_completions_endpoint_stream_and_not(gateway, spec_fake):
    spec_fake.script(text="once upon a time", chunks=4)
    openai_client = client(gateway)
    done = openai_client.completions.create(model="smollm2", prompt="Tell a story", **GREEDY)
    assert done.choices[0].text == "once upon a time"
    streamed = openai_client.completions.create(model="smollm2", prompt="Tell a story", stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "once upon a time"


def test_generated_request_id_is_returned_and_forwarded(gateway, spec_fake):
    response = httpx.post(gateway.base_url + "/chat/completions",
                          json={"model": "m", "messages": MESSAGES, **GREEDY})
    rid = response.headers["x-request-id"]
    assert len(rid) == 32
    assert spec_fake.completion_requests()[-1].headers["x-request-id"] == rid


def test_hop_by_hop_headers_are_stripped_both_ways(gateway, spec_fake):
    headers = {"connection": "keep-alive, x-private", "keep-alive": "timeout=5", "te": "trailers",
               "proxy-authorization": "Basic abc", "x-custom": "kept"}
    response = httpx.post(gateway.base_url + "/chat/completions", headers=headers,
                          json={"model": "m", "messages": MESSAGES, **GREEDY})
    seen = spec_fake.completion_requests()[-1].headers
    assert seen["x-custom"] == "kept"
    for name in ("keep-alive", "te", "proxy-authorization"):
        assert name not in seen
    # the backend's framing stays with the backend: one content-length of our own
    assert response.headers.get_list("transfer-encoding") == []
    assert response.headers.get_list("content-length") == [str(len(response.content))]
    assert response.headers.get_list("server") == ["uvicorn"]  # ours, not the backend's as well


def test_stream_is_relayed_chunk_by_chunk_not_buffered(gateway, spec_fake):
    spec_fake.script(text="first second third", chunks=3)
    hold = spec_fake.hold()
    try:
        with httpx.stream("POST", gateway.base_url + "/chat/completions", timeout=10,
                          json={"model": "m", "messages": MESSAGES, "stream": True, **GREEDY}) as response:
            lines = response.iter_lines()
            first_content = None
            for line in lines:
                if line.startswith("data: ") and '"content"' in line and '"content":""' not in line:
                    first_content = json.loads(line[6:])["choices"][0]["delta"]["content"]
                    break
            # The client holds a content chunk while the backend still holds back the rest.
            assert first_content == "first "
            assert spec_fake.holding.wait(5)  # the second chunk is still held back upstream
            hold.set()
            rest = [line for line in lines if line.startswith("data: ")]
    finally:
        spec_fake.release()
    assert rest[-1] == "data: [DONE]"
    assert any("third" in line for line in rest)


@pytest.mark.parametrize("own_protocol", [False, True], ids=["uvicorn", "specgate-serve"])
@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_cancels_the_upstream_request(start_gateway, spec_fake, std_fake, stream, own_protocol):
    """Under uvicorn's own protocol a task watches `receive`; under `specgate serve`'s the
    protocol tells the relay when the connection is lost (DISCONNECT_EXTENSION)."""
    http = with_header_timeout(60.0) if own_protocol else "auto"
    gateway = start_gateway(policy_dict([spec_fake.url], [std_fake.url]), http=http)
    spec_fake.script(text="a b c d e f g h", chunks=8, delay=0.4)
    body = {"model": "m", "messages": MESSAGES, "stream": stream, **GREEDY}
    if stream:
        with httpx.stream("POST", gateway.base_url + "/chat/completions", json=body, timeout=10) as response:
            next(line for line in response.iter_lines() if '"content"' in line)
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=0.5)
    assert spec_fake.wait_disconnect(5)
    assert spec_fake.disconnects[-1].chunks_sent < 8  # the backend stopped before its answer ended


def test_keepalive_comments_while_waiting_for_the_first_token(start_gateway, spec_fake, std_fake):
    gw = start_gateway(policy_dict([spec_fake.url], [std_fake.url]), keepalive_s=0.2)
    spec_fake.script(text="late answer", chunks=2, delay=1.0)
    with httpx.stream("POST", gw.base_url + "/chat/completions", timeout=10,
                      json={"model": "m", "messages": MESSAGES, "stream": True, **GREEDY}) as response:
        lines = [line for line in response.iter_lines() if line]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert lines[:first_data].count(": keepalive") >= 3
    assert lines[-1] == "data: [DONE]"
    # the openai client ignores the comments
    text = "".join(c.choices[0].delta.content or "" for c in client(gw).chat.completions.create(
        model="m", messages=MESSAGES, stream=True, **GREEDY) if c.choices)
    assert text == "late answer"


def test_retry_on_another_endpoint_before_the_first_byte(start_gateway, std_fake):
    with FakeVllm(model="upstream-spec") as first, FakeVllm(model="upstream-spec") as second:
        gw = start_gateway(policy_dict([first.url, second.url], [std_fake.url]))
        first.fail_next(100, status=503)
        for i in range(20):  # prompts of their own: the pool's balancer sends some to each endpoint
            response = httpx.post(gw.base_url + "/chat/completions",
                                  json={"model": "m", "messages": [{"role": "user", "content": f"q{i}"}], **GREEDY})
            assert response.status_code == 200, response.text
            assert response.headers["x-specgate-pool"] == "speculative"
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'specgate_retries_total{pool="speculative"}' in metrics
        assert 'specgate_upstream_errors_total{kind="status_503",pool="speculative"}' in metrics


def test_connect_error_retries_then_gives_502(start_gateway, std_fake):
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    with FakeVllm(model="upstream-spec") as alive:
        gw = start_gateway(policy_dict([dead, alive.url], [std_fake.url]))
        for _ in range(4):
            response = httpx.post(gw.base_url + "/chat/completions",
                                  json={"model": "m", "messages": MESSAGES, **GREEDY})
            assert response.status_code == 200
    gw = start_gateway({**policy_dict([dead], [dead]), "rules": [{"name": "all", "route": "standard"}]})
    response = httpx.post(gw.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"


def test_first_byte_timeout_is_504(start_gateway, spec_fake, std_fake):
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["pools"]["speculative"]["timeouts"] = {"connect_s": 1, "first_byte_s": 0.3, "total_s": 0.6}
    gw = start_gateway(policy)
    spec_fake.delay_first_byte(2.0, count=2)
    # a stream's first byte is bounded by first_byte_s (the endpoint's fault); a whole body comes at
    # the end of the generation, so only the request's own total_s bounds it (its outcome)
    for stream, code in ((True, "upstream_timeout"), (False, "deadline_exceeded")):
        response = httpx.post(gw.base_url + "/chat/completions", timeout=5,
                              json={"model": "m", "messages": MESSAGES, "stream": stream, **GREEDY})
        assert response.status_code == 504
        assert response.json()["error"]["code"] == code


def test_total_timeout_bounds_the_whole_answer(start_gateway, spec_fake, std_fake):
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["pools"]["speculative"]["timeouts"] = {"connect_s": 1, "first_byte_s": 1, "total_s": 1.2}
    gw = start_gateway(policy)
    spec_fake.script(text="a b c d e f g h", chunks=8, delay=0.3)  # 2.4 s in all, 0.3 s between chunks
    with httpx.stream("POST", gw.base_url + "/chat/completions", timeout=10,
                      json={"model": "m", "messages": MESSAGES, "stream": True, **GREEDY}) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert json.loads(lines[-1][6:])["error"]["code"] == "deadline_exceeded"
    assert not any(line == "data: [DONE]" for line in lines)  # cut before the backend finished
    assert spec_fake.wait_disconnect(5) and spec_fake.disconnects[-1].chunks_sent < 8
    response = httpx.post(gw.base_url + "/chat/completions", timeout=10,
                          json={"model": "m", "messages": MESSAGES, **GREEDY})
    assert response.status_code == 504


HI_THEN_DONE = [b"data: " + json.dumps({
    "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
    "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}).encode() + b"\n\n",
    b"data: [DONE]\n\n"]


def events_within_one_second(start_gateway, spec_url: str, std_url: str) -> tuple[Gateway, list[str]]:
    """The gateway, and the SSE events a streamed request reads through a gateway whose speculative
    pool (`spec_url`) has a total timeout of one second."""
    policy = policy_dict([spec_url], [std_url])
    policy["pools"]["speculative"]["timeouts"] = {"connect_s": 1, "first_byte_s": 1, "total_s": 1.0}
    gw = start_gateway(policy)
    with httpx.stream("POST", gw.base_url + "/chat/completions", timeout=10,
                      json={"model": "m", "messages": MESSAGES, "stream": True, **GREEDY}) as response:
        return gw, [e for e in response.read().decode().split("\n\n") if e.strip()]


def test_a_stream_cut_mid_event_never_reaches_the_client_half_done(start_gateway, std_fake):
    # a whole event, half of one, then a stall past the pool's total_s (its idle_s is longer)
    with RawSseBackend([b'data: {"choices": []}\n\n', b'data: {"choi'], pause_s=3, finish=False) as backend:
        _, events = events_within_one_second(start_gateway, backend.url, std_fake.url)
    assert [json.loads(e.removeprefix("data: ")) for e in events][0] == {"choices": []}
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "deadline_exceeded"
    assert len(events) == 2  # the half event was held back, not sent


def test_a_client_that_leaves_after_done_had_the_whole_answer(start_gateway, std_fake):
    # The backend sends [DONE] but ends its chunked body only later; the openai
    # client closes its connection as soon as it reads [DONE].
    with RawSseBackend(HI_THEN_DONE, pause_s=1, finish=True) as backend:
        gw = start_gateway(policy_dict([backend.url], [std_fake.url]))
        stream = client(gw).chat.completions.create(model="m", messages=MESSAGES, stream=True, **GREEDY)
        assert "".join(c.choices[0].delta.content or "" for c in stream) == "hi"
        counted = 'specgate_requests_total{api="chat",code="%s",pool="speculative",rule="default"} 1.0'
        wait_until(lambda: counted % 200 in httpx.get(gw.url + "/metrics").text, "the stream counted as 200", 5)
        assert counted % 499 not in httpx.get(gw.url + "/metrics").text


def test_a_backend_that_closes_after_the_deadline_still_gave_a_whole_answer(start_gateway, std_fake):
    # [DONE] went out before the pool's total timeout; the chunked body ends only
    # after it. The client reads a whole answer with nothing after [DONE].
    with RawSseBackend(HI_THEN_DONE, pause_s=3, finish=True) as backend:
        gw, events_read = events_within_one_second(start_gateway, backend.url, std_fake.url)
    assert events_read[-1] == "data: [DONE]"
    assert json.loads(events_read[0].removeprefix("data: "))["choices"][0]["delta"]["content"] == "hi"
    assert 'specgate_requests_total{api="chat",code="200",pool="speculative",rule="default"} 1.0' \
        in httpx.get(gw.url + "/metrics").text


def test_upstream_4xx_passes_through_unchanged(gateway, spec_fake):
    spec_fake.fail_next(1, status=400, message="This model's maximum context length is 2048 tokens.")
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway).chat.completions.create(model="m", messages=MESSAGES, **GREEDY)
    assert "maximum context length" in info.value.message
    assert info.value.response.headers["x-specgate-pool"] == "speculative"


def test_stream_cut_mid_way_ends_with_an_error_event(gateway, spec_fake):
    spec_fake.script(text="a b c d e f", chunks=6)
    spec_fake.cut_stream(after_events=3)
    with pytest.raises(openai.APIError):
        for _ in client(gateway).chat.completions.create(model="m", messages=MESSAGES, stream=True, **GREEDY):
            pass


def test_unhealthy_speculative_pool_falls_back_to_its_fallback(gateway, spec_fake, std_fake):
    spec_fake.set_healthy(False)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        response = httpx.post(gateway.base_url + "/chat/completions",
                              json={"model": "m", "messages": MESSAGES, **GREEDY})
        if response.headers["x-specgate-pool"] == "standard":
            break
        time.sleep(0.1)
    assert response.headers["x-specgate-pool"] == "standard"
    assert std_fake.completion_requests()[-1].body["model"] == "upstream-std"
    spec_fake.set_healthy(True)


def test_no_capacity_and_no_queue_is_429_with_retry_after(start_gateway, std_fake):
    gw = start_gateway({**policy_dict([std_fake.url], [std_fake.url], max_in_flight=1, queue={"max_waiting": 0}),
                        "rules": [{"name": "all", "route": "standard"}]})
    hold = std_fake.hold()
    body = {"model": "m", "messages": MESSAGES, "stream": True, **GREEDY}
    try:
        with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=10) as first:
            assert first.status_code == 200
            busy = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=5)
            assert busy.status_code == 429  # shed: the queue holds nobody
            assert busy.headers["retry-after"]
            assert busy.json()["error"]["code"] == "rate_limit_exceeded"
            hold.set()
    finally:
        std_fake.release()


def test_models_is_the_union_of_the_pools(gateway):
    ids = sorted(m.id for m in client(gateway).models.list())
    assert ids == ["upstream-spec", "upstream-std"]


def test_other_v1_paths_pass_through_to_the_default_pool(gateway, std_fake):
    response = httpx.post(gateway.base_url + "/embeddings", json={"model": "m", "input": "x"})
    assert response.headers["x-specgate-pool"] == "standard"
    assert response.headers["x-specgate-rule"] == "passthrough"
    assert std_fake.requests[-1].path == "/v1/embeddings"


def test_route_and_domain_headers_when_the_policy_allows(gateway):
    response = httpx.post(gateway.base_url + "/chat/completions", headers={"x-specgate-route": "standard"},
                          json={"model": "m", "messages": MESSAGES, **GREEDY})
    assert (response.headers["x-specgate-pool"], response.headers["x-specgate-rule"]) == ("standard", "header")
    bad = httpx.post(gateway.base_url + "/chat/completions", headers={"x-specgate-route": "nowhere"},
                     json={"model": "m", "messages": MESSAGES})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-specgate-route"


@pytest.mark.parametrize("content,status,fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b'{"messages": "hi"}', 400, "'messages' must be a non-empty list"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400, "'temperature' must be"),
    (b"[]", 400, "must be a JSON object"),
])
def test_bad_requests_get_the_openai_error_envelope(gateway, content, status, fragment):
    response = httpx.post(gateway.base_url + "/chat/completions", content=content,
                          headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"]


def test_body_over_the_limit_is_413(start_gateway, spec_fake, std_fake):
    gw = start_gateway(policy_dict([spec_fake.url], [std_fake.url]), max_body_bytes=1024)
    response = httpx.post(gw.base_url + "/chat/completions",
                          json={"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


def test_unknown_path_is_404_envelope(gateway):
    response = httpx.get(gateway.url + "/nothing/here")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


def test_health_readiness_and_metrics(gateway, spec_fake):
    assert httpx.get(gateway.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(gateway.url + "/readyz").status_code == 200
    httpx.post(gateway.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES, **GREEDY})
    text = httpx.get(gateway.url + "/metrics").text
    for name in ("specgate_requests_total", "specgate_request_duration_seconds_bucket",
                 "specgate_time_to_first_byte_seconds_bucket", "specgate_in_flight",
                 "specgate_endpoint_healthy", "specgate_speculative_enabled", "specgate_overhead_seconds_bucket"):
        assert name in text, name
    assert 'specgate_requests_total{api="chat",code="200",pool="speculative",rule="default"} 1.0' in text
    assert 'specgate_in_flight{pool="speculative"} 0.0' in text


def test_concurrent_streams_all_complete(gateway, spec_fake):
    spec_fake.script(text="w1 w2 w3 w4", chunks=4, delay=0.01)
    results: list[str] = []

    def one() -> None:
        text = "".join(c.choices[0].delta.content or "" for c in client(gateway).chat.completions.create(
            model="m", messages=MESSAGES, stream=True, **GREEDY) if c.choices)
        results.append(text)

    threads = [threading.Thread(target=one) for _ in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert results == ["w1 w2 w3 w4"] * 24
    assert 'specgate_in_flight{pool="speculative"} 0.0' in httpx.get(gateway.url + "/metrics").text
