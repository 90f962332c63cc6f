"""A slow upload is the client's own time: every latency the gateway measures
and learns from runs from the moment the body is complete, and an upload
that does not finish within body_timeout_s is answered 408. Real gateway,
fake vLLM backends, a raw socket client, all on 127.0.0.1."""

from __future__ import annotations

import json
import queue
import time

from gateway.upstream.meter import Measurement

from .conftest import policy_dict
from .raw_http import RawConnection

PAUSE_S = 1.5  # the upload's pause: far longer than the fake's whole answer
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Tell me about rivers."}],
                   "temperature": 0, "max_tokens": 64, "stream": True}).encode()


def head(gateway_url: str, length: int) -> bytes:
    host = gateway_url.removeprefix("http://")
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {length}\r\n\r\n").encode()


def test_a_slow_upload_is_not_counted_in_the_time_to_first_token(start_gateway, spec_fake, std_fake):
    gw = start_gateway(policy_dict([spec_fake.url], [std_fake.url]))
    measured: queue.Queue[Measurement] = queue.Queue()  # what every sink, the latency model's too, is handed
    gw.app.state.proxy.recorder.sinks.append(measured.put)
    with RawConnection(gw.url, 30) as connection:
        connection.send(head(gw.url, len(BODY)) + BODY[:20])
        time.sleep(PAUSE_S)  # the client uploads slowly
        connection.send(BODY[20:])
        answer = connection.answer("POST")
    assert answer is not None and answer.status == 200 and b"[DONE]" in answer.body
    measurement = measured.get(timeout=30)
    # The pause was the client's: the backend answered in a fraction of it.
    assert measurement.ttft_s is not None and measurement.ttft_s < PAUSE_S, measurement
    assert measurement.e2e_s < PAUSE_S, measurement


def test_an_upload_that_does_not_finish_within_body_timeout_s_is_a_408(start_gateway, spec_fake, std_fake):
    gw = start_gateway(policy_dict([spec_fake.url], [std_fake.url]), body_timeout_s=0.3)
    with RawConnection(gw.url, 30) as connection:
        connection.send(head(gw.url, len(BODY)) + BODY[:20])  # and nothing more
        answer = connection.answer("POST")
    assert answer is not None and answer.status == 408
    assert answer.json()["error"]["code"] == "request_timeout"
    assert spec_fake.completion_requests() == []
    healthy = RawConnection(gw.url, 30)
    with healthy:
        healthy.send(head(gw.url, len(BODY)) + BODY)
        after = healthy.answer("POST")
    assert after is not None and after.status == 200
