"""Property tests: whatever JSON a client sends, the gateway answers without a
500 and without hanging, with the OpenAI error envelope on every 4xx."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.settings import Settings
from tests.fakes.vllm import FakeVllm

from .conftest import policy_dict

pytestmark = pytest.mark.slow  # fuzzing: thousands of generated requests

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
FIELDS = ["model", "messages", "prompt", "temperature", "top_p", "max_tokens", "max_completion_tokens",
          "stream", "n", "tools", "response_format", "logprobs", "stop", "stream_options"]
request_like = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8)
chat_like = st.fixed_dictionaries(
    {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]),
                                                 "content": json_values}), min_size=1, max_size=3)},
    optional={name: json_values for name in FIELDS if name != "messages"})


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory) -> str:
    path: Path = tmp_path_factory.mktemp("fuzz") / "policy.yaml"
    with FakeVllm(model="upstream-spec") as spec, FakeVllm(model="upstream-std", kind="standard") as std:
        spec.script(text="ok", chunks=1)
        std.script(text="ok", chunks=1)
        path.write_text(yaml.safe_dump(policy_dict([spec.url], [std.url])))
        server = BackgroundServer(create_app(Settings(policy=path)), lifespan="on").start()
        try:
            yield server.url
        finally:
            server.stop(graceful=True)


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert "Traceback" not in error["message"]


FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(body=json_values)
def test_any_json_value(gateway_url, body):
    check(httpx.post(gateway_url + "/v1/chat/completions", json=body, timeout=10))


@FUZZ
@given(body=request_like, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_request_shaped_objects(gateway_url, body, path):
    check(httpx.post(gateway_url + path, json=body, timeout=10))


@FUZZ
@given(body=chat_like)
def test_chat_shaped_objects(gateway_url, body):
    check(httpx.post(gateway_url + "/v1/chat/completions", json=body, timeout=10))


@FUZZ
@given(raw=st.binary(max_size=256))
def test_arbitrary_bytes(gateway_url, raw):
    check(httpx.post(gateway_url + "/v1/chat/completions", content=raw, timeout=10,
                     headers={"content-type": "application/json"}))


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e999}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999999999999999999999999}',
    b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
    b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"a":' * 5000 + b"1" + b"}" * 5000,
])
def test_edge_cases(gateway_url, raw):
    check(httpx.post(gateway_url + "/v1/chat/completions", content=raw, timeout=10,
                     headers={"content-type": "application/json"}))
