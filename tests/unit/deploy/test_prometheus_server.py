"""The committed Prometheus config and rules, run by a real Prometheus server.

Fake backends on 127.0.0.1 expose vLLM V1 counters that grow at known rates;
Prometheus scrapes them through the committed jobs (targets swapped for the
loopback addresses, intervals shortened) and evaluates the committed rules.
This proves the `pool` relabeling and the recording rules on real scrapes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from gateway.control.signals import PrometheusSource, Target
from gateway.policy.loader import load_policy
from tests.unit.deploy.conftest import DEPLOY, REPO, require_tool

pytestmark = pytest.mark.slow  # a real Prometheus server scraping live targets

DEADLINE_S = 40


# The names as Prometheus receives them from vLLM: prometheus_client writes
# `vllm:x` as `vllm_x` in the OpenMetrics format Prometheus negotiates, and the
# committed config's metric relabeling must restore vLLM's names.
def speculative_metrics(elapsed: float) -> str:
    # Per second: 25 drafts of 4 tokens, 40 accepted (acceptance 0.4).
    labels = 'model_name="m",engine="0"'
    return "".join([
        "# TYPE vllm_spec_decode_num_drafts_total counter\n",
        f"vllm_spec_decode_num_drafts_total{{{labels}}} {25 * elapsed}\n",
        "# TYPE vllm_spec_decode_num_draft_tokens_total counter\n",
        f"vllm_spec_decode_num_draft_tokens_total{{{labels}}} {100 * elapsed}\n",
        "# TYPE vllm_spec_decode_num_accepted_tokens_total counter\n",
        f"vllm_spec_decode_num_accepted_tokens_total{{{labels}}} {40 * elapsed}\n",
    ])


def standard_metrics(elapsed: float) -> str:
    return '# TYPE vllm_num_requests_running gauge\nvllm_num_requests_running{model_name="m",engine="0"} 3\n'


def gateway_metrics(elapsed: float) -> str:
    return ("# TYPE specgate_guard_up gauge\nspecgate_guard_up 1\n"
            '# TYPE specgate_speculative_enabled gauge\nspecgate_speculative_enabled{pool="speculative"} 1\n')


class MetricsServer:
    """A /metrics endpoint on 127.0.0.1 whose body is a function of elapsed time."""

    def __init__(self, render) -> None:
        started = time.monotonic()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                body = render(time.monotonic() - started).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> MetricsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Prometheus on the committed config, scraping the fakes; yields its API base URL."""
    binary = require_tool("prometheus")
    tmp_path = tmp_path_factory.mktemp("prometheus")
    fakes = {"vllm-speculative": MetricsServer(speculative_metrics),
             "vllm-standard": MetricsServer(standard_metrics),
             "specgate-gateway": MetricsServer(gateway_metrics)}
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    assert {job["job_name"] for job in config["scrape_configs"]} == set(fakes)
    for job in config["scrape_configs"]:
        job["static_configs"][0]["targets"] = [fakes[job["job_name"]].address]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    port = free_port()
    for fake in fakes.values():
        fake.__enter__()
    # Prometheus logs to stderr: into a file, where it never fills a pipe nobody reads.
    with open(tmp_path / "prometheus.log", "wb") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=log)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for fake in fakes.values():
                fake.__exit__()


def query_until(base: str, promql: str, predicate) -> list[dict]:
    """Poll an instant query until `predicate(result)` holds, within DEADLINE_S."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    deadline = time.monotonic() + DEADLINE_S
    result: list[dict] = []
    while time.monotonic() < deadline:
        try:
            result = get_json(url)["data"]["result"]
        except OSError:
            result = []  # not listening yet
        if predicate(result):
            return result
        time.sleep(0.5)
    pytest.fail(f"{promql} never satisfied the check; last result: {result}")


def test_recording_rules_on_real_scrapes_separate_the_pools(prometheus):
    [acceptance] = query_until(prometheus, "pool:vllm_spec_decode_acceptance:ratio_rate5m",
                               lambda r: len(r) == 1)
    assert acceptance["metric"] == {"__name__": "pool:vllm_spec_decode_acceptance:ratio_rate5m",
                                    "pool": "speculative"}
    assert float(acceptance["value"][1]) == pytest.approx(0.4, abs=1e-6)
    [length] = query_until(prometheus, "pool:vllm_spec_decode_mean_accepted_length:rate5m",
                           lambda r: len(r) == 1)
    assert float(length["value"][1]) == pytest.approx(2.6, abs=1e-6)
    [running] = query_until(prometheus, "vllm:num_requests_running", lambda r: len(r) == 1)
    assert (running["metric"]["job"], running["metric"]["pool"]) == ("vllm-standard", "standard")


def test_alert_rules_load_and_stay_quiet_on_healthy_series(prometheus):
    query_until(prometheus, "pool:vllm_spec_decode_acceptance:ratio_rate5m", lambda r: len(r) == 1)
    groups = get_json(f"{prometheus}/api/v1/rules")["data"]["groups"]
    alerts = {rule["name"]: rule for group in groups for rule in group["rules"] if rule["type"] == "alerting"}
    assert set(alerts) == {"LowAcceptRate", "CriticalAcceptRate", "SpeculativeLatencyRegression",
                           "GatewayFallbackActive", "GuardDown", "StateStoreDown"}
    assert all(rule["health"] in {"ok", "unknown"} for rule in alerts.values())
    # 0.4 is below 0.5: LowAcceptRate is pending (its `for: 10m` has not elapsed).
    pending = query_until(prometheus, 'ALERTS{alertstate="pending"}', lambda r: len(r) >= 1)
    assert {a["metric"]["alertname"] for a in pending} == {"LowAcceptRate"}


def test_the_deployed_policy_selects_each_pool_on_real_scrapes(prometheus):
    """The guard's own queries, built from the policy the Compose stack and the
    Kubernetes ConfigMap ship, find each pool's series: the targets' addresses
    (pod IPs in Kubernetes, loopback here) never appear in the selector."""
    policy = load_policy(REPO / "policies" / "examples" / "compose.yaml")
    spec = policy.spec.guard
    targets = [Target(name, pool.dialect, tuple(e.url for e in pool.endpoints))
               for name, pool in policy.pools.items()]

    async def read_until_seen() -> dict:
        source = PrometheusSource(prometheus)
        try:
            deadline = time.monotonic() + DEADLINE_S
            while True:
                signals = await source.read(targets, spec)
                if signals["speculative"].acceptance_rate is not None or time.monotonic() > deadline:
                    return signals
                await asyncio.sleep(0.5)
        finally:
            await source.aclose()

    signals = asyncio.run(read_until_seen())
    speculative, standard = signals["speculative"], signals["standard"]
    assert speculative.acceptance_rate == pytest.approx(0.4, abs=0.01)
    assert speculative.running is None and standard.running == 3
    assert standard.acceptance_rate is None and standard.volume_tokens == 0
