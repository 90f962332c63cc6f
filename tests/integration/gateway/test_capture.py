"""Prompt capture through a live gateway: PII never reaches the disk or the logs, a full queue drops."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import yaml

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.settings import Settings
from tests.integration.gateway.conftest import START_GUARD_S, policy_dict

PII = {
    "jane.doe@example.com": "<EMAIL>",
    "+44 20 7946 0958": "<PHONE>",
    "4111 1111 1111 1111": "<CARD>",
    "DE89 3704 0044 0532 0130 00": "<IBAN>",
    "203.0.113.42": "<IP>",
    "AKIAIOSFODNN7EXAMPLE": "<SECRET>",
    "sk-live-9fQ2xZ7LmR4tB8wK1vN6pYc3HdJ0sE5u": "<SECRET>",
}
PROMPT = ("My email is jane.doe@example.com and my phone +44 20 7946 0958. Pay with 4111 1111 1111 1111 "
          "or to IBAN DE89 3704 0044 0532 0130 00. The server is 203.0.113.42, the AWS key "
          "AKIAIOSFODNN7EXAMPLE and the API key sk-live-9fQ2xZ7LmR4tB8wK1vN6pYc3HdJ0sE5u. Summarise my account.")
HANG_GUARD_S = 120.0


def metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(url + "/metrics").text
    match = re.search(rf"^{name}_total{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_for(check, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard, not a timing assertion
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def capture_policy(spec_url: str, std_url: str, directory: Path, **capture) -> dict:
    policy = policy_dict([spec_url], [std_url])
    policy["capture"] = {"enabled": True, "share": 1.0, "directory": str(directory), **capture}
    return policy


@pytest.mark.slow
def test_captured_prompts_hold_placeholders_not_pii(start_gateway, spec_fake, std_fake, tmp_path, capfd, caplog):
    directory = tmp_path / "capture"
    gw = start_gateway(capture_policy(spec_fake.url, std_fake.url, directory))
    with openai.OpenAI(base_url=gw.base_url, api_key="client-key", max_retries=0) as client:
        for _ in range(2):
            answer = client.chat.completions.create(
                model="m", max_tokens=40,
                messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}])
            assert answer.choices[0].message.content
        client.completions.create(model="m", prompt=PROMPT, max_tokens=40)
    wait_for(lambda: metric(gw.url, "specgate_capture_written") >= 3, "three captured prompts")

    files = sorted(directory.glob("capture-*.jsonl"))
    text = "".join(path.read_text(encoding="utf-8") for path in files)
    logs = capfd.readouterr()
    for secret, placeholder in PII.items():
        for where, content in (("capture files", text), ("stdout", logs.out), ("stderr", logs.err),
                               ("log records", caplog.text)):
            assert secret not in content, f"{secret!r} reached the {where}"
        assert placeholder in text
    records = [json.loads(line) for line in text.splitlines()]
    assert len(records) == 3
    assert {r["endpoint"] for r in records} == {"chat", "completions"}
    chat = next(r for r in records if r["endpoint"] == "chat")
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]
    assert chat["class"] is not None and "Summarise my account." in chat["messages"][1]["content"]
    assert set(records[0]) == {"time", "class", "endpoint", "messages"}  # no answer, headers or key
    assert "client-key" not in text
    assert metric(gw.url, "specgate_capture_redactions", '{kind="email"}') == 3


@pytest.mark.slow  # seconds of wall time: it runs in `make test`, not `make check`
def test_a_full_queue_drops_and_counts_and_requests_still_succeed(start_gateway, spec_fake, std_fake, tmp_path):
    gw = start_gateway(capture_policy(spec_fake.url, std_fake.url, tmp_path / "capture", queue=1))
    capture = gw.app.state.parts.capture
    entered, release = threading.Event(), threading.Event()
    write = capture._write

    def gated(*args):
        entered.set()
        assert release.wait(HANG_GUARD_S)
        return write(*args)

    capture._write = gated  # the writer holds its first batch until released
    with openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client:
        def ask():
            return client.chat.completions.create(
                model="m", max_tokens=40, messages=[{"role": "user", "content": "hello there"}])

        assert ask().choices[0].message.content
        assert entered.wait(HANG_GUARD_S)  # the first prompt is being written
        for _ in range(4):  # one waits in the queue, three find it full
            assert ask().choices[0].message.content
        assert metric(gw.url, "specgate_capture_dropped", '{reason="queue_full"}') == 3
        release.set()
    wait_for(lambda: metric(gw.url, "specgate_capture_written") == 2, "the two queued prompts written")


@pytest.mark.slow  # two builds of the scrubber
def test_a_killed_scrubbing_process_is_replaced_and_clients_never_see_it(start_gateway, spec_fake, std_fake,
                                                                         tmp_path):
    gw = start_gateway(capture_policy(spec_fake.url, std_fake.url, tmp_path / "capture"))
    first = gw.app.state.parts.capture.worker
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: not first.process.is_alive(), "the scrubbing process gone")
    with openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client:
        answer = client.chat.completions.create(model="m", max_tokens=8, messages=[{"role": "user", "content": PROMPT}])
        assert answer.choices[0].message.content
    wait_for(lambda: metric(gw.url, "specgate_capture_written") >= 1, "the prompt written by another process")
    assert metric(gw.url, "specgate_capture_worker_died") == 1
    assert gw.app.state.parts.capture.worker.pid not in (first.pid, os.getpid())


@pytest.mark.slow  # starts the scrubbing process, which imports presidio
def test_a_zero_share_captures_nothing(start_gateway, spec_fake, std_fake, tmp_path):
    directory = tmp_path / "capture"
    gw = start_gateway(capture_policy(spec_fake.url, std_fake.url, directory, share=0.0))
    with openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client:
        client.chat.completions.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert metric(gw.url, "specgate_capture_sampled") == 0
    assert not directory.exists()


@pytest.mark.slow  # starts the scrubbing process, which imports presidio
def test_messages_and_responses_are_captured_as_chat_turns(start_gateway, spec_fake, std_fake, tmp_path):
    directory = tmp_path / "capture"
    gw = start_gateway(capture_policy(spec_fake.url, std_fake.url, directory))
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as claude:
        claude.messages.create(model="m", max_tokens=40, system="You are terse.",
                               messages=[{"role": "user", "content": [{"type": "text", "text": PROMPT}]}])
    with openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0) as client:
        client.responses.create(model="m", instructions="You are terse.", input=PROMPT)
    wait_for(lambda: metric(gw.url, "specgate_capture_written") >= 2, "two captured prompts")
    text = "".join(path.read_text(encoding="utf-8") for path in sorted(directory.glob("capture-*.jsonl")))
    records = {r["endpoint"]: r for r in map(json.loads, text.splitlines())}
    assert set(records) == {"messages", "responses"}
    for record in records.values():
        assert [m["role"] for m in record["messages"]] == ["system", "user"]
        assert "Summarise my account." in record["messages"][1]["content"] and "<EMAIL>" in text


@pytest.mark.slow  # starts the scrubbing process, which imports presidio
def test_a_relative_capture_directory_is_next_to_the_policy_not_the_working_directory(
        start_gateway, spec_fake, std_fake, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the process's working directory is not the policy's folder
    gw = start_gateway(capture_policy(spec_fake.url, std_fake.url, Path("captured")))
    with openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0) as client:
        client.chat.completions.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    wait_for(lambda: metric(gw.url, "specgate_capture_written") >= 1, "one captured prompt")
    assert list((gw.policy_path.parent / "captured").glob("capture-*.jsonl"))
    assert not (elsewhere / "captured").exists()


@pytest.mark.slow  # starts the scrubbing process, which imports presidio
def test_the_gateway_serves_and_says_ready_only_once_the_scrubbing_process_is_built(spec_fake, std_fake, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(capture_policy(spec_fake.url, std_fake.url, tmp_path / "capture")))
    app = create_app(Settings(policy=path))
    capture = app.state.parts.capture
    building, release = threading.Event(), threading.Event()
    prepare = capture.prepare

    async def held() -> None:  # the start-up's build, held until the test has looked
        building.set()
        await asyncio.to_thread(release.wait, HANG_GUARD_S)
        await prepare()

    capture.prepare = held
    server = BackgroundServer(app, lifespan="on")
    starting = threading.Thread(target=server.start, kwargs={"timeout": START_GUARD_S})
    starting.start()
    try:
        assert building.wait(HANG_GUARD_S)
        with pytest.raises(httpx.ConnectError):  # not listening yet: no request, /readyz included, is served
            httpx.get(server.url + "/readyz")
        assert capture.worker is None
        release.set()
        starting.join(START_GUARD_S)
        assert server.running
        ready = httpx.get(server.url + "/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        worker = capture.worker  # built in a process of its own
        assert worker is not None and worker.alive and worker.pid != os.getpid()
    finally:
        release.set()
        starting.join(START_GUARD_S)
        server.stop(graceful=True)
    assert not worker.process.is_alive()  # the gateway's shutdown ended it
