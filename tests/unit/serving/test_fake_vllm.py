"""The fake vLLM does what gateway tests rely on, over real loopback HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.fakes import FakeVllm, FakeVllmProcess

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="fake-model", kind="speculative") as running:
        yield running


def client(fake: FakeVllm) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fake.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def api(fake: FakeVllm) -> Iterator[openai.OpenAI]:
    with client(fake) as opened:
        yield opened


def metric_lines(url: str) -> list[str]:
    return [line for line in httpx.get(f"{url}/metrics").text.splitlines() if line.startswith("vllm:")]


def events(raw: str) -> list[str]:
    return [event for event in raw.split("\n\n") if event]


def test_scripted_answers_through_the_openai_client(fake: FakeVllm, api: openai.OpenAI) -> None:
    fake.script(text="one two three four", chunks=4)
    reply = api.chat.completions.create(**CHAT)
    assert reply.choices[0].message.content == "one two three four"
    assert reply.usage.completion_tokens == 4 and reply.model == "fake-model"

    stream = api.chat.completions.create(**CHAT, stream=True, max_tokens=2)
    deltas = [c.choices[0] for c in stream]
    assert [d.delta.content for d in deltas] == ["", "one ", "two "]
    assert deltas[-1].finish_reason == "length"

    text = api.completions.create(model="fake-model", prompt="p")
    assert text.choices[0].text == "one two three four"


def test_hold_proves_chunks_arrive_unbuffered(fake: FakeVllm) -> None:
    fake.script(text="abcd", chunks=4)
    hold = fake.hold()
    body = {**CHAT, "stream": True}
    with httpx.stream("POST", f"{fake.url}/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        received = []
        while len(received) < 2:  # role chunk, then content chunk 1
            line = next(lines)
            if line:
                received.append(json.loads(line.removeprefix("data: ")))
        assert received[1]["choices"][0]["delta"]["content"] == "a"
        assert fake.holding.wait(5), "the server should be paused after chunk 1"
        hold.set()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert "".join(json.loads(r[6:])["choices"][0]["delta"]["content"] for r in rest[:-1]) == "bcd"


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_is_observed(fake: FakeVllm, stream: bool) -> None:
    fake.script(chunks=200, delay=0.05)
    url = f"{fake.url}/v1/chat/completions"
    with httpx.Client(timeout=0.3) as http:
        if stream:
            with http.stream("POST", url, json={**CHAT, "stream": True}) as response:
                next(response.iter_lines())
        else:
            with pytest.raises(httpx.ReadTimeout):
                http.post(url, json=CHAT, headers={"x-request-id": "gone-1"})
    assert fake.wait_disconnect(5)
    (disconnect,) = fake.disconnects
    assert disconnect.path == "/v1/chat/completions" and disconnect.chunks_sent < 200
    if not stream:
        assert disconnect.request_id == "gone-1"


@pytest.mark.parametrize(
    ("status", "err_type"),
    [(500, "InternalServerError"), (429, "TooManyRequestsError"), (503, "ServiceUnavailableError")],
)
def test_fail_next_answers_vllm_error_bodies(fake: FakeVllm, api: openai.OpenAI, status: int, err_type: str) -> None:
    fake.fail_next(2, status=status, message="overloaded")
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as caught:
            api.chat.completions.create(**CHAT)
        assert caught.value.status_code == status
        error = caught.value.response.json()["error"]
        assert error == {"message": "overloaded", "type": err_type, "param": None, "code": status}
    assert api.chat.completions.create(**CHAT).choices[0].message.content
    assert httpx.get(f"{fake.url}/metrics").status_code == 200  # faults spare /metrics


def test_first_byte_delay(fake: FakeVllm) -> None:
    fake.delay_first_byte(2.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{fake.url}/v1/chat/completions", json=CHAT, timeout=0.2)
    assert httpx.post(f"{fake.url}/v1/chat/completions", json=CHAT).status_code == 200


def test_cut_stream_drops_the_connection_mid_sse(fake: FakeVllm) -> None:
    fake.script(chunks=6)
    fake.cut_stream(after_events=3)
    seen: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream(
            "POST", f"{fake.url}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as response:
            for line in response.iter_lines():
                if line:
                    seen.append(line)
    assert len(seen) == 3 and "[DONE]" not in "".join(seen)
    ok = httpx.post(f"{fake.url}/v1/chat/completions", json={**CHAT, "stream": True})
    assert events(ok.text)[-1] == "data: [DONE]"


def test_health_and_restart_on_the_same_port(fake: FakeVllm) -> None:
    fake.set_healthy(False)
    assert httpx.get(f"{fake.url}/health").status_code == 503
    fake.set_healthy(True)
    url, port = fake.url, fake.port
    fake.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")
    fake.start()
    assert fake.port == port and httpx.get(f"{url}/health").status_code == 200


def test_stop_drops_a_held_stream(fake: FakeVllm) -> None:
    fake.hold()
    errors: list[Exception] = []

    def read() -> None:
        try:
            httpx.post(f"{fake.url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10)
        except httpx.HTTPError as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    assert fake.holding.wait(5)
    fake.stop()
    reader.join(10)
    assert not reader.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], httpx.RemoteProtocolError)


def test_metric_controls_use_vllm_names(fake: FakeVllm) -> None:
    fake.record_spec_decode(
        num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12, accepted_per_pos=(6, 4, 2)
    )
    fake.set_load(running=8, waiting=2)
    labels = '{engine="0",model_name="fake-model"}'
    lines = metric_lines(fake.url)
    for expected in (
        f"vllm:spec_decode_num_drafts_total{labels} 10.0",
        f"vllm:spec_decode_num_draft_tokens_total{labels} 30.0",
        f"vllm:spec_decode_num_accepted_tokens_total{labels} 12.0",
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="fake-model",position="2"} 2.0',
        f"vllm:num_requests_running{labels} 8.0",
        f"vllm:num_requests_waiting{labels} 2.0",
    ):
        assert expected in lines
    fake.set_load()
    assert f"vllm:num_requests_running{labels} 0.0" in metric_lines(fake.url)


def test_traffic_moves_spec_counters_when_acceptance_is_set() -> None:
    with FakeVllm(kind="speculative", spec_acceptance=2 / 3) as fake:
        fake.script(chunks=5)
        with client(fake) as api:
            api.chat.completions.create(**CHAT)
        lines = metric_lines(fake.url)
    assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="fake-model"} 5.0' in lines
    assert 'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="fake-model"} 10.0' in lines


def test_standard_kind_has_no_spec_metrics() -> None:
    with FakeVllm(model="std", kind="standard") as fake:
        text = "\n".join(metric_lines(fake.url))
    assert "vllm:num_requests_running" in text and "spec_decode" not in text


def test_requests_are_recorded(fake: FakeVllm) -> None:
    httpx.post(
        f"{fake.url}/v1/chat/completions",
        json={**CHAT, "temperature": 0.2},
        headers={"x-request-id": "abc", "X-Custom": "1"},
    )
    (recorded,) = fake.completion_requests()
    assert recorded.path == "/v1/chat/completions" and recorded.method == "POST"
    assert recorded.headers["x-request-id"] == "abc" and recorded.headers["x-custom"] == "1"
    assert recorded.body["temperature"] == 0.2


@pytest.mark.slow
def test_fake_as_a_process_can_be_killed_and_restarted() -> None:
    with FakeVllmProcess("--kind", "standard", "--model", "proc", "--text", "hey") as proc:
        ask = {"model": "proc", "prompt": "x"}
        assert httpx.post(f"{proc.url}/v1/completions", json=ask).json()["choices"][0]["text"] == "hey"
        proc.kill()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{proc.url}/health")
        proc.start()
        assert httpx.post(f"{proc.url}/v1/completions", json=ask).status_code == 200


def test_random_faults_are_seeded_and_counted(fake: FakeVllm) -> None:
    fake.faults_at_random(seed=3, fail_rate=0.5, fail_status=503)
    statuses = [
        httpx.post(f"{fake.url}/v1/chat/completions", json=CHAT).status_code for _ in range(20)
    ]
    assert set(statuses) == {200, 503}
    assert fake.faults.injected == {"fail": statuses.count(503)}


@pytest.mark.slow
def test_process_fake_stops_on_sigterm_and_records(tmp_path) -> None:
    record = tmp_path / "record.json"
    proc = FakeVllmProcess("--record", str(record)).start()
    httpx.post(f"{proc.url}/v1/completions", json={"model": "fake-model", "prompt": "x"})
    proc.terminate()  # waits for the exit; a hang would raise TimeoutExpired
    assert len(json.loads(record.read_text())["arrivals"]) == 1
