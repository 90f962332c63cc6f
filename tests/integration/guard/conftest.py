"""A real Prometheus scraping fake vLLM backends whose counters the test drives."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator

import pytest
import yaml

from gateway.control.signals import address
from tests.fakes.process import free_port, wait_until_ok
from tests.fakes.vllm import FakeVllm


class Feeder:
    """Records finished requests with fixed latencies on a fake at a steady pace,
    and on a speculative fake grows the spec-decode counters with the acceptance
    the test sets."""

    def __init__(self, fake: FakeVllm, acceptance: float = 0.8, tick_s: float = 0.1) -> None:
        self.fake = fake
        self.acceptance = acceptance
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        k = self.fake.metrics.num_speculative_tokens or 0
        drafts = 10
        while not self._stop.wait(self.tick_s):
            accepted_per_draft = round(self.acceptance * k)
            per_pos = tuple(drafts if pos < accepted_per_draft else 0 for pos in range(k))
            if k:
                self.fake.record_spec_decode(drafts, drafts * k, drafts * accepted_per_draft, per_pos)
            self.fake.metrics.observe_finished(prompt_tokens=10, generation_tokens=20, finish_reason="stop",
                                               e2e_seconds=1.2, ttft_seconds=0.05,
                                               inter_token_seconds=(0.02, 0.03, 0.04, 0.06))

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class PrometheusProcess:
    """`prometheus` on 127.0.0.1 with a temporary database, scraping `targets` every second."""

    def __init__(self, binary: str, workdir, targets: list[str]) -> None:
        self.port = free_port()
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": targets}]}]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.command = [binary, f"--config.file={workdir / 'prometheus.yml'}",
                        f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusProcess:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_ok(self.url + "/-/ready", self.process, timeout=30)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()  # SIGKILL always ends it


@pytest.fixture
def fakes() -> Iterator[tuple[FakeVllm, FakeVllm]]:
    with FakeVllm(model="upstream-spec", kind="speculative") as spec, \
            FakeVllm(model="upstream-std", kind="standard") as std:
        yield spec, std


@pytest.fixture
def prometheus(fakes, tmp_path) -> Iterator[PrometheusProcess]:
    from tests.unit.deploy.conftest import require_tool

    server = PrometheusProcess(require_tool("prometheus"), tmp_path, [address(f.url) for f in fakes])
    server.start()
    try:
        yield server
    finally:
        server.kill()
