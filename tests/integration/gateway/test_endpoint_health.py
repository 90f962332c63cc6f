"""An endpoint's health counts only its own faults: a stream cut by its own
total_s or by its client says nothing of the endpoint, a silent one does.
Every ejection and restoration is logged, and the fallback header names the
cause. Real gateway, fake vLLM backends, all on 127.0.0.1."""

from __future__ import annotations

import json

import httpx

from tests.fakes.waiting import wait_until

from .conftest import Gateway, policy_dict
from .test_request_path import GREEDY, assert_idle, post


def with_timeouts(policy: dict, pool: str, **timeouts: float) -> dict:
    entry = policy["pools"][pool]
    entry["timeouts"] = {**entry["timeouts"], **timeouts}
    return policy


def stream_events(gateway: Gateway) -> list[dict]:
    """A streamed request read to its end, as its JSON events."""
    events = []
    with httpx.stream("POST", gateway.base_url + "/chat/completions", json={**GREEDY, "stream": True},
                      timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[len("data: "):]))
    return events


def speculative_endpoint(gateway: Gateway):
    return gateway.app.state.runtime.pools["speculative"].endpoints[0]


def test_streams_cut_by_their_own_total_s_leave_a_healthy_endpoint_in_rotation(start_gateway, spec_fake,
                                                                               std_fake, capsys):
    gw = start_gateway(with_timeouts(policy_dict([spec_fake.url], [std_fake.url]), "speculative", total_s=0.5))
    spec_fake.script(text=" ".join(["word"] * 40), chunks=40, delay=0.05)  # sends steadily past total_s
    for _ in range(4):  # the test policy ejects after 2 failures
        events = stream_events(gw)
        assert events[0]["choices"], events[0]  # tokens came, then the request's own deadline cut it
        assert events[-1]["error"]["code"] == "deadline_exceeded", events[-1]
        assert_idle(gw)
    endpoint = speculative_endpoint(gw)
    assert (endpoint.failures, endpoint.ejected()) == (0, False)
    out = capsys.readouterr().out
    assert "endpoint_ejected" not in out
    assert "error=deadline_exceeded" in out
    spec_fake.script(delay=0.0, chunks=4)
    answer = post(gw, GREEDY)
    assert (answer.headers["x-specgate-pool"], answer.headers.get("x-specgate-reason")) == ("speculative", None)


def test_a_silent_stream_ejects_its_endpoint_and_the_log_and_fallback_say_so(start_gateway, spec_fake,
                                                                             std_fake, capsys):
    gw = start_gateway(with_timeouts(policy_dict([spec_fake.url], [std_fake.url]), "speculative", idle_s=0.2))
    hold = spec_fake.hold()  # the first token comes, then silence
    try:
        for _ in range(2):  # eject_after: 2
            events = stream_events(gw)
            assert events[-1]["error"]["code"] == "upstream_timeout", events[-1]
    finally:
        hold.set()
    endpoint = speculative_endpoint(gw)
    wait_until(endpoint.ejected, "the second silent stream ejects the endpoint")
    ejected = [line for line in capsys.readouterr().out.splitlines() if "endpoint_ejected" in line]
    assert len(ejected) == 1 and "reason=idle" in ejected[0] and "failures=2" in ejected[0], ejected
    spec_fake.release()
    answer = post(gw, GREEDY)
    assert (answer.headers["x-specgate-pool"], answer.headers["x-specgate-reason"]) == ("standard",
                                                                                        "fallback:ejected")
    wait_until(lambda: post(gw, GREEDY).headers["x-specgate-pool"] == "speculative",
               "the half-open trial after the back-off")
    # the client has the answer before the gateway gives the lease back: wait for the state
    wait_until(lambda: not endpoint.ejected(), "the trial's success restores the endpoint")
    restored = [line for line in capsys.readouterr().out.splitlines() if "endpoint_restored" in line]
    assert len(restored) == 1 and "failures=2" in restored[0], restored


def test_clients_that_leave_mid_stream_are_counted_once_and_never_against_the_endpoint(gateway, spec_fake):
    registry = gateway.app.state.metrics.registry
    hold = spec_fake.hold()
    try:
        for left in range(1, 4):  # more than eject_after
            with httpx.stream("POST", gateway.base_url + "/chat/completions",
                              json={**GREEDY, "stream": True}, timeout=30) as response:
                first = next(line for line in response.iter_lines() if line.startswith("data: "))
                assert json.loads(first[len("data: "):])["choices"]
            # the client closed its connection mid-stream
            wait_until(lambda left=left: len(spec_fake.disconnects) == left, "the backend saw the cancel")
            assert_idle(gateway)
    finally:
        hold.set()
    endpoint = speculative_endpoint(gateway)
    assert (endpoint.failures, endpoint.ejected()) == (0, False)
    labels = {"pool": "speculative", "rule": "default", "code": "499", "api": "chat"}
    wait_until(lambda: registry.get_sample_value("specgate_requests_total", labels) == 3, "three 499s")
    assert registry.get_sample_value("specgate_upstream_errors_total",
                                     {"pool": "speculative", "kind": "stream_cut"}) is None
