"""OpenTelemetry traces through a running gateway, exported to a real OTLP/HTTP
receiver on 127.0.0.1: the gateway's span continues the client's W3C trace,
carries the GenAI attributes and the decision, and its context reaches the backend."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from tests.fakes.otlp import OtlpReceiver
from tests.fakes.process import free_port
from tests.integration.gateway.conftest import Gateway, policy_dict

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as found:
        yield found


@pytest.fixture
def traced(start_gateway, spec_fake, std_fake, receiver) -> Gateway:
    return start_gateway(policy_dict([spec_fake.url], [std_fake.url]),
                         OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_SERVICE_NAME="gateway-under-test")


def chat(gateway: Gateway, stream: bool, temperature: float = 0.0) -> None:
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        answer = client.chat.completions.create(
            model="client-model", messages=[{"role": "user", "content": "hello"}], max_tokens=64,
            temperature=temperature, stream=stream,
            extra_headers={"traceparent": TRACEPARENT, "tracestate": "vendor=abc"})
        if stream:
            assert "".join(c.choices[0].delta.content or "" for c in answer if c.choices)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_span_continues_the_clients_trace_and_carries_the_decision(traced, receiver, spec_fake, stream):
    chat(traced, stream)
    traced.server.stop(graceful=True)  # the shutdown flushes the batched spans
    assert len(receiver.spans) == 1
    span = receiver.spans[0]
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == CLIENT_SPAN
    assert span.name == "chat client-model" and span.kind == span.SPAN_KIND_SERVER
    assert receiver.services == ["gateway-under-test"]
    found = receiver.attributes(span)
    assert {k: found[k] for k in ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.request.temperature",
                                  "gen_ai.request.max_tokens", "gen_ai.response.finish_reasons")} == {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "client-model",
        "gen_ai.request.temperature": 0.0, "gen_ai.request.max_tokens": 64,
        "gen_ai.response.finish_reasons": ["stop"]}
    assert found["gen_ai.usage.input_tokens"] > 0 and found["gen_ai.usage.output_tokens"] > 0
    assert (found["specgate.pool"], found["specgate.rule"], found["specgate.served_pool"]) == (
        "speculative", "default", "speculative")
    assert found["specgate.reason"] and found["specgate.endpoint"] == spec_fake.url
    assert found["http.response.status_code"] == 200 and span.status.code != span.status.STATUS_CODE_ERROR
    if stream:
        assert found["specgate.measured.ttft_s"] > 0
    sent = spec_fake.completion_requests()[-1].headers
    assert sent["traceparent"] == f"00-{TRACE_ID}-{span.span_id.hex()}-01", "the backend joins under the gateway"
    assert sent["tracestate"] == "vendor=abc"


def test_hot_sampling_is_traced_to_the_standard_pool(traced, receiver, std_fake):
    chat(traced, stream=True, temperature=1.5)
    traced.server.stop(graceful=True)
    found = receiver.attributes(receiver.spans[0])
    assert (found["specgate.pool"], found["specgate.rule"], found["gen_ai.request.temperature"]) == (
        "standard", "hot-sampling", 1.5)
    assert std_fake.completion_requests()[-1].headers["traceparent"].split("-")[2] == receiver.spans[0].span_id.hex()


def test_a_trace_the_client_does_not_sample_is_not_exported_but_continued(traced, receiver, spec_fake):
    with openai.OpenAI(base_url=traced.base_url, api_key="unused", max_retries=0) as client:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=64,
                                       extra_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-00"})
        chat(traced, stream=False)  # then a sampled one, so that an export happens at all
    traced.server.stop(graceful=True)
    assert [receiver.attributes(s)["gen_ai.request.model"] for s in receiver.spans] == ["client-model"]
    unsampled = spec_fake.completion_requests()[0].headers["traceparent"].split("-")
    assert (unsampled[1], unsampled[3]) == (TRACE_ID, "00") and unsampled[2] != CLIENT_SPAN


def test_a_request_without_trace_context_starts_a_trace(traced, receiver):
    with openai.OpenAI(base_url=traced.base_url, api_key="unused", max_retries=0) as client:
        client.completions.create(model="m", prompt="hello", max_tokens=64)
    traced.server.stop(graceful=True)
    span = receiver.spans[0]
    assert span.parent_span_id == b"" and len(span.trace_id) == 16
    assert span.name == "text_completion m"


def test_a_failed_request_sets_the_span_status(start_gateway, receiver):
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = start_gateway(policy_dict([dead], [dead]), OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
    with (openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client,
          pytest.raises(openai.APIStatusError) as failed):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=64)
    gateway.server.stop(graceful=True)
    span = receiver.spans[0]
    found = receiver.attributes(span)
    assert span.status.code == span.status.STATUS_CODE_ERROR
    assert found["http.response.status_code"] == failed.value.status_code >= 500
    assert found["error.type"]


def test_a_refused_request_is_traced_without_an_error_status(traced, receiver):
    """A 4xx is the client's error: the span says which, its status stays unset."""
    with (openai.OpenAI(base_url=traced.base_url, api_key="unused", max_retries=0) as client,
          pytest.raises(openai.BadRequestError)):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=10**9,
                                       extra_headers={"traceparent": TRACEPARENT})
    traced.server.stop(graceful=True)
    span = receiver.spans[0]
    found = receiver.attributes(span)
    assert span.trace_id.hex() == TRACE_ID and found["http.response.status_code"] == 400
    assert span.status.code == span.status.STATUS_CODE_UNSET and found["specgate.rule"] == "default"


# The tracing modules. OpenTelemetry's API and metrics SDK may be imported all the same: redis-py loads them
# when they are installed, for its own (unused) metrics.
TRACING = ("gateway.telemetry.otlp", "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")
CHECK = ("import sys; from gateway.edge.app import create_app; from gateway.settings import Settings; "
         f"create_app(Settings()); print([m for m in {TRACING!r} if m in sys.modules])")


@pytest.mark.parametrize(("env", "imported"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}, True),
])
def test_opentelemetry_is_imported_only_while_tracing_is_on(env, imported):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    ran = subprocess.run([sys.executable, "-c", CHECK], env={**clean, **env, "PYTHONPATH": os.getcwd()},
                         capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == (repr(list(TRACING)) if imported else "[]")
