"""Capture's parts: the scrubber, the rotated files, the bounded queue, the policy section."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from gateway.capture.files import CaptureFiles
from gateway.capture.scrub import Scrubber
from gateway.capture.stage import Capture
from gateway.capture.worker import records
from gateway.metrics import GatewayMetrics
from gateway.policy.capture import CaptureSpec
from gateway.policy.loader import PolicyError, parse_policy


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    return Scrubber("US")


@pytest.mark.slow
@pytest.mark.parametrize(("text", "secret", "placeholder"), [
    ("write to ops@example.org today", "ops@example.org", "<EMAIL>"),
    ("call (415) 555-2671 now", "(415) 555-2671", "<PHONE>"),
    ("or +33 1 42 68 53 00 from Paris", "+33 1 42 68 53 00", "<PHONE>"),
    ("card 5555-5555-5555-4444 expires", "5555-5555-5555-4444", "<CARD>"),
    ("iban GB82WEST12345698765432 please", "GB82WEST12345698765432", "<IBAN>"),
    ("host 10.1.2.3 is down", "10.1.2.3", "<IP>"),
    ("v6 2001:db8::8a2e:370:7334 too", "2001:db8::8a2e:370:7334", "<IP>"),
    ("token ghp_1234567890abcdefghijABCDEFGHIJ123456 leaked", "ghp_1234567890abcdefghijABCDEFGHIJ123456", "<SECRET>"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dBjftJeZ4CVPmB92K27uhbUJU1p1r", "eyJhbGci",
     "<SECRET>"),
    ('password = "correct-horse-battery"', "correct-horse-battery", "<SECRET>"),
    ("api key Zq8Xw2Lr5Tn9Vb3Kp7Yd1Hs4Jf6Mg0", "Zq8Xw2Lr5Tn9Vb3Kp7Yd1Hs4Jf6Mg0", "<SECRET>"),
    ("DB_PASSWORD=hunter2horse in the env", "hunter2horse", "<SECRET>"),
    ("export OPENAI_API_KEY=abc123def456 first", "abc123def456", "<SECRET>"),
    ("set github_token: plainvalue42 there", "plainvalue42", "<SECRET>"),
    ("key sk-proj-abcdefghijklmnop1234 here", "sk-proj-abcdefghijklmnop1234", "<SECRET>"),
    ("sk-ant-api03-abcdefghijklmnopqrstuv", "sk-ant-api03-abcdefghijklmnopqrstuv", "<SECRET>"),
    ("slack xoxb-123456789012-abcdefghij bot", "xoxb-123456789012-abcdefghij", "<SECRET>"),
    ("aws AKIAIOSFODNN7EXAMPLE id", "AKIAIOSFODNN7EXAMPLE", "<SECRET>"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abc_def-123", "eyJzdWIiOiIxMjM0In0", "<SECRET>"),
    ("my SSN is 123-45-6789, ok", "123-45-6789", "<ID>"),
    ("NINO AB 12 34 56 C on file", "AB 12 34 56 C", "<ID>"),
    ("CPF 123.456.789-09 registered", "123.456.789-09", "<ID>"),
])
def test_each_kind_becomes_its_placeholder(scrubber, text, secret, placeholder):
    scrubbed, counts = scrubber.scrub(text)
    assert secret not in scrubbed
    assert placeholder in scrubbed and counts[placeholder] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("text", [
    "Summarise the 2024 annual report in 3 bullet points.",
    "def internationalization_helper(x): return x * 1500000",
    "A card that fails Luhn: 4111 1111 1111 1112, an IBAN with a bad checksum: GB00WEST12345698765432.",
    "Version 1.2.3 of the package was released on 2024-05-03, build 3f8a9c7e2b1d.",
    "Set key=value pairs, for example colour=blue; the token count is 12.",
])
def test_ordinary_text_is_kept(scrubber, text):
    assert scrubber.scrub(text) == (text, {})


def test_files_rotate_by_size_and_keep_at_most_max_files(tmp_path):
    files = CaptureFiles(tmp_path, max_file_bytes=1024, max_files=3, retention_days=1)
    for i in range(40):
        files.append([f'{{"n": {i}, "pad": "{"x" * 100}"}}'])
    kept = files.files()
    assert len(kept) == 3
    assert all(path.stat().st_size <= 1024 for path in kept)
    last = [line for path in kept for line in path.read_text().splitlines()]
    assert '"n": 39' in last[-1]  # the newest are kept
    assert oct(kept[0].stat().st_mode & 0o777) == "0o600"


def test_files_past_retention_are_deleted_and_others_left_alone(tmp_path):
    files = CaptureFiles(tmp_path, max_file_bytes=1 << 20, max_files=10, retention_days=1)
    files.append(["{}"])
    old = files.files()[0]
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    (tmp_path / "notes.txt").write_text("not ours")
    files.current = None
    files.append(["{}"])
    assert not old.exists() and len(files.files()) == 1
    assert (tmp_path / "notes.txt").exists()


def test_a_full_queue_drops_and_counts_without_blocking(tmp_path):
    metrics = GatewayMetrics()
    capture = Capture(CaptureSpec(enabled=True, share=1.0, directory=str(tmp_path), queue=2), metrics)
    for _ in range(5):
        capture.offer("chat", {"messages": [{"role": "user", "content": "hi"}]}, "chat/low")
    assert capture.queue.qsize() == 2
    assert metrics.capture_sampled._value.get() == 2
    assert metrics.capture_dropped.labels("queue_full")._value.get() == 3


def test_share_samples_about_that_fraction():
    metrics = GatewayMetrics()
    capture = Capture(CaptureSpec(enabled=True, share=0.25, directory="unused", queue=10_000), metrics,
                      rng=random.Random(7))
    for _ in range(4000):
        capture.offer("completions", {"prompt": "x"}, None)
    assert 900 < capture.queue.qsize() < 1100


def test_capture_is_off_by_default_and_needs_a_directory():
    assert CaptureSpec().enabled is False
    base = "version: 1\npools: {a: {kind: standard, endpoints: [{url: 'http://x'}]}}\nrules: [{name: r, route: a}]\n"
    assert parse_policy(base).spec.capture.enabled is False
    with pytest.raises(PolicyError, match="capture"):
        parse_policy(base + "capture: {enabled: true}\n")
    with pytest.raises(PolicyError, match="share"):
        parse_policy(base + "capture: {enabled: true, directory: d, share: 1.5}\n")


def test_an_idle_capture_still_deletes_files_past_retention(tmp_path, monkeypatch):
    from gateway.capture import stage

    monkeypatch.setattr(stage, "PRUNE_EVERY_S", 0.01)
    old = tmp_path / "capture-20200101T000000Z-1-000001.jsonl"
    old.write_text("{}\n")
    os.utime(old, (0, 0))
    capture = Capture(CaptureSpec(directory=str(tmp_path)), GatewayMetrics())  # off: nothing new comes

    async def scenario() -> None:
        task = asyncio.create_task(capture.run())
        async with asyncio.timeout(30):  # a hang guard
            while old.exists():
                await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert not old.exists()


def test_every_stored_string_is_scrubbed_and_roles_come_from_a_closed_set(scrubber):
    messages = [{"role": "user ops@example.org", "name": "jane.doe@example.com", "content": "hello"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"function": {"name": "f", "arguments": '{"key": "AKIAIOSFODNN7EXAMPLE"}'}}]},
                {"role": "tool", "content": [{"type": "text", "text": "export API_TOKEN=s3cr3tvalue"}]}]
    lines, counts = records([(0.0, "chat", None, messages, 0), (0.0, "completions", None, "", 0)], scrubber)
    text = "".join(lines)
    assert len(lines) == 1  # the empty prompt has no record
    for secret in ("ops@example.org", "jane.doe@example.com", "AKIAIOSFODNN7EXAMPLE", "s3cr3tvalue"):
        assert secret not in text
    assert '"role":"other"' in text and '"role":"tool"' in text and counts == {"<SECRET>": 1}


def test_the_queue_is_bounded_in_bytes_and_oversize_prompts_are_skipped(tmp_path):
    metrics = GatewayMetrics()
    spec = CaptureSpec(enabled=True, share=1.0, directory=str(tmp_path), queue=1000,
                       queue_bytes=10_000, max_prompt_bytes=4096)
    capture = Capture(spec, metrics)
    capture.offer("chat", {"messages": [{"role": "user", "content": "x" * (8 << 20)}]}, None)
    capture.offer("completions", {"prompt": "y" * 5000}, None)
    assert metrics.capture_dropped.labels("too_large")._value.get() == 2
    for _ in range(5):
        capture.offer("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "z" * 3000}]}]},
                      None)
    assert capture.queue.qsize() == 3 and capture.queued_bytes == 9000
    assert metrics.capture_dropped.labels("queue_full")._value.get() == 2


async def written(metrics: GatewayMetrics, count: int) -> None:
    async with asyncio.timeout(120):  # a hang guard
        while metrics.capture_written._value.get() < count:
            await asyncio.sleep(0.01)


def offer_email(capture: Capture) -> None:
    capture.offer("chat", {"messages": [{"role": "user", "content": "mail ops@example.org"}]}, None)


@pytest.mark.slow  # starts the scrubbing process, which imports presidio
def test_a_reload_that_turns_capture_on_starts_the_scrubbing_process_before_the_first_write(tmp_path):
    metrics = GatewayMetrics()
    capture = Capture(CaptureSpec(directory=str(tmp_path)), metrics)  # off at start-up: nothing to start

    async def scenario() -> None:
        await capture.prepare()
        assert capture.worker is None
        capture.apply(CaptureSpec(enabled=True, share=1.0, directory=str(tmp_path), phone_region="GB"))
        task = asyncio.create_task(capture.run())
        offer_email(capture)
        try:
            await written(metrics, 1)
            worker = capture.worker
            assert worker is not None and worker.alive and worker.region == "GB" and worker.pid != os.getpid()
            capture.apply(CaptureSpec(directory=str(tmp_path)))  # off again: the process ends
            assert capture.worker is None and not worker.process.is_alive()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            capture.close()

    asyncio.run(scenario())
    text = "".join(path.read_text() for path in capture.files.files())
    assert "<EMAIL>" in text and "ops@example.org" not in text


@pytest.mark.slow  # three builds of the scrubber, seconds each
def test_a_killed_scrubbing_process_is_counted_and_the_next_batch_starts_another(tmp_path):
    metrics = GatewayMetrics()
    capture = Capture(CaptureSpec(enabled=True, share=1.0, directory=str(tmp_path)), metrics)
    write = capture._write
    pids = []

    def killed_while_scrubbing(batch, files, worker):
        os.kill(worker.pid, signal.SIGKILL)
        worker.process.join()
        return write(batch, files, worker)

    async def scenario() -> None:
        await capture.prepare()
        task = asyncio.create_task(capture.run())
        try:
            first = capture.worker
            pids.append(first.pid)
            os.kill(first.pid, signal.SIGKILL)  # killed between batches
            first.process.join()
            offer_email(capture)
            await written(metrics, 1)  # the batch started another process first
            pids.append(capture.worker.pid)
            capture._write = killed_while_scrubbing
            offer_email(capture)
            async with asyncio.timeout(120):  # a hang guard
                while metrics.capture_dropped.labels("error")._value.get() < 1:
                    await asyncio.sleep(0.01)
            assert capture.worker is None  # the dead one is gone; the next batch starts another
            capture._write = write
            offer_email(capture)
            await written(metrics, 2)
            pids.append(capture.worker.pid)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            capture.close()

    asyncio.run(scenario())
    assert len(set(pids)) == 3 and os.getpid() not in pids
    assert metrics.capture_worker_died._value.get() == 2
    assert metrics.capture_dropped.labels("error")._value.get() == 1  # the batch in the process killed
    lines = [line for path in capture.files.files() for line in path.read_text().splitlines()]
    assert len(lines) == 2 and all("<EMAIL>" in line for line in lines)


@pytest.mark.slow  # one build of the scrubber, in a process started for the test
def test_the_gateway_process_imports_no_scrubbing_library(tmp_path):
    code = ("import asyncio, json, sys\n"
            "from gateway.capture.stage import Capture\n"
            "from gateway.metrics import GatewayMetrics\n"
            "from gateway.policy.capture import CaptureSpec\n"
            f"capture = Capture(CaptureSpec(enabled=True, directory={str(tmp_path)!r}), GatewayMetrics())\n"
            "asyncio.run(capture.prepare())\n"
            "print(json.dumps([capture.worker is not None and capture.worker.alive,\n"
            "                  sorted(m for m in ('presidio_analyzer', 'spacy', 'torch', 'phonenumbers') "
            "if m in sys.modules)]))\n"
            "capture.close()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert json.loads(done.stdout) == [True, []]  # the scrubber is built, in the child only
