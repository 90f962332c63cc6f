"""Through a running gateway: flags survive a restart and are shared through the
flags file; streamed answers feed the per-class token timing."""

from __future__ import annotations

import json
import time

import httpx
import openai
import yaml

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.settings import Settings
from tests.fakes.waiting import wait_until
from tests.integration.gateway.conftest import ADMIN_TOKEN, policy_dict

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def start(policy: dict, tmp_path, **settings) -> BackgroundServer:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    app = create_app(Settings(policy=path, admin_token=ADMIN_TOKEN, policy_watch_interval_s=0.1, **settings))
    return BackgroundServer(app, lifespan="on").start()


def mode(server: BackgroundServer) -> str:
    return httpx.get(server.url + "/admin/flags", headers=AUTH).json()["speculative"]["mode"]


def test_flags_survive_a_restart_and_replicas_share_them(fakes, tmp_path):
    spec_fake, std_fake = fakes
    policy = policy_dict([spec_fake.url], [std_fake.url])
    flags_file = tmp_path / "flags.json"
    first = start(policy, tmp_path, flags_file=flags_file)
    second = start(policy, tmp_path, flags_file=flags_file)
    try:
        assert httpx.put(first.url + "/admin/flags/speculative", headers=AUTH,
                         json={"mode": "force_off"}).status_code == 200
        wait_until(lambda: mode(second) == "force_off", "the other replica applies the file")
        assert json.loads(flags_file.read_text())["speculative"]["mode"] == "force_off"
    finally:
        first.stop(graceful=True)
    restarted = start(policy, tmp_path, flags_file=flags_file)
    try:
        assert mode(restarted) == "force_off"
        metrics = httpx.get(restarted.url + "/metrics").text
        assert 'specgate_speculative_enabled{pool="speculative"} 0.0' in metrics
    finally:
        restarted.stop(graceful=True)
        second.stop(graceful=True)


def test_streamed_answers_feed_per_class_timing(fakes, tmp_path):
    spec_fake, std_fake = fakes
    spec_fake.script(text="one two three four five six", chunks=6, delay=0.01)
    policy = policy_dict([spec_fake.url], [std_fake.url])
    policy["guard"] = {"enabled": True, "interval_s": 60, "classes": {"enabled": True, "min_samples": 1}}
    server = start(policy, tmp_path)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    try:
        elapsed: dict[str, float] = {}
        for content in ("def f(): pass", "hello"):
            started = time.monotonic()
            stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}],
                                                    max_tokens=64, temperature=0.3, stream=True)
            text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            elapsed[content] = time.monotonic() - started
            assert text == "one two three four five six"
        classes = server.app.state.proxy.class_latency
        # recorded when the exchange finishes, a moment after the client read the last event
        wait_until(lambda: all(classes.samples(c, "speculative", 60) for c in ("code/low", "chat/low")),
                   "a timing sample for each class")
        code = classes.samples("code/low", "speculative", 60)
        assert len(code) == 1 and len(classes.samples("chat/low", "speculative", 60)) == 1
        # Seconds per token over the 5 gaps between the 6 pieces: they fit inside the
        # whole exchange the client saw. (No lower bound: arrivals can bunch up.)
        assert 0 < code[0] <= elapsed["def f(): pass"] / 5
    finally:
        server.stop(graceful=True)
