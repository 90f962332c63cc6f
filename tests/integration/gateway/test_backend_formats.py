"""A backend that formats its JSON and SSE differently from vLLM (spaces after
separators, another key order, unicode escapes, `data:` without a space,
CRLF line endings) is relayed whole and measured by its usage block. A
socket-level backend and a real gateway, on 127.0.0.1."""

from __future__ import annotations

import gzip
import json
import queue

import httpx

from gateway.upstream.meter import Measurement
from tests.fakes.raw_sse import RawSseBackend

from .conftest import policy_dict
from .test_request_path import GREEDY

EVENTS = [
    b'data:{"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, '
    b'"delta": {"content": "caf\\u00e9 "}, "finish_reason": null}]}\r\n\r\n',
    b'data:{"choices": [{"finish_reason": null, "index": 0, "delta": {"content": "au lait"}}], "id": "x"}\r\n\r\n',
    b'data:{"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\r\n\r\n',
    b'data:{"usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}, "choices": []}\r\n\r\n',
    b"data:[DONE]\r\n\r\n",
]


def test_a_differently_formatted_stream_is_relayed_whole_and_measured(start_gateway, std_fake):
    with RawSseBackend(EVENTS, pause_s=0, finish=True) as backend:
        gw = start_gateway(policy_dict([backend.url], [std_fake.url]))
        measured: queue.Queue[Measurement] = queue.Queue()
        gw.app.state.proxy.recorder.sinks.append(measured.put)
        body = {**GREEDY, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=30) as response:
            raw = response.read()
    assert response.status_code == 200
    data = [line.removeprefix(b"data:").strip() for line in raw.split(b"\r\n") if line.startswith(b"data:")]
    assert data[-1] == b"[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "café au lait"
    assert chunks[-1]["usage"]["completion_tokens"] == 7
    measurement = measured.get(timeout=30)
    assert measurement.tokens == 7 and measurement.streamed


def test_the_usage_chunk_the_gateway_asked_for_stays_hidden_whatever_the_format(start_gateway, std_fake):
    with RawSseBackend(EVENTS, pause_s=0, finish=True) as backend:
        gw = start_gateway(policy_dict([backend.url], [std_fake.url]))
        measured: queue.Queue[Measurement] = queue.Queue()
        gw.app.state.proxy.recorder.sinks.append(measured.put)
        with httpx.stream("POST", gw.base_url + "/chat/completions", json={**GREEDY, "stream": True},
                          timeout=30) as response:
            raw = response.read()
    data = [line.removeprefix(b"data:").strip() for line in raw.split(b"\r\n") if line.startswith(b"data:")]
    assert data[-1] == b"[DONE]"
    assert not any(b'"usage"' in d for d in data), data
    assert measured.get(timeout=30).tokens == 7


def test_a_compressed_answer_reaches_the_client_as_the_backend_sent_it(start_gateway, std_fake):
    """A proxy relays the bytes and their `content-encoding` together: decoding the body
    while keeping the header would hand the client plain JSON labelled gzip."""
    payload = gzip.compress(json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "café"}, "finish_reason": "stop"}]}).encode())
    answer = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
              b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
    with RawSseBackend([], answer=answer) as backend:
        gw = start_gateway(policy_dict([backend.url], [std_fake.url]))
        response = httpx.post(gw.base_url + "/chat/completions", json=GREEDY, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "gzip"
    assert response.headers["content-length"] == str(len(payload))
    assert response.json()["choices"][0]["message"]["content"] == "café"
