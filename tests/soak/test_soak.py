"""Soak: 10,000 mixed requests through a gateway process while backends fail.

Seven fake vLLM processes sit behind the gateway in two pools. Some fail at
random (500, 503, 429), answer late (first byte after the pool's
`first_byte_s`) or cut their streams; one of each pool is killed and
restarted over and over; one always answers 503 while its health check
passes, and takes one request at a time, so passive ejection is the only
thing that keeps traffic away from it. 5% of the streaming clients hang up
after their first chunk. The test asserts that every request
ends in a complete answer or an OpenAI error within its timeout, that the
sick endpoint saw at most one request per back-off once ejected, that
nothing stays in flight and that the gateway's memory and open files come
back to where they were after a warm-up.

    pytest tests/soak/test_soak.py -s   # prints the summary; SOAK_REPORT=path also writes it
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.fakes.process import FakeVllmProcess
from tests.soak.checks import backoff_violations
from tests.soak.gateway_process import GatewayProcess
from tests.soak.load import LoadReport, run_load

pytestmark = [pytest.mark.soak, pytest.mark.timeout(420)]

REQUESTS = int(os.environ.get("SOAK_REQUESTS", "10000"))
WARMUP_REQUESTS = 1000
CONCURRENCY = 256
ABANDON_RATE = 0.05  # of streams: the client hangs up after the first chunk
TIMEOUTS = {"connect_s": 0.5, "first_byte_s": 1.0, "total_s": 4.0}
HEALTH = {"interval_s": 0.5, "eject_after": 3, "backoff_s": 1.0, "max_backoff_s": 4.0}
CLIENT_TIMEOUT_S = TIMEOUTS["total_s"] + 4.0  # the pool's total plus a margin for a loaded 2-core machine
SLOW_S = 1.5  # later than first_byte_s: a stream gets 504, a non-stream waits
STREAM = ("--chunks", "16", "--delay", "0.02")  # 0.3 s per answer: kills land mid-stream
RSS_GROWTH_LIMIT = 50 * 1024 * 1024
FD_GROWTH_LIMIT = 20


class Backends:
    """The fake processes by name: some inject faults, `killable` ones get killed.
    Each records its arrivals and the faults it dealt to NAME.json on exit."""

    SPEC = {
        "spec-503s": ("--fail-rate", "0.03", "--fail-status", "503", "--slow-rate", "0.03",
                      "--slow-seconds", str(SLOW_S), "--cut-rate", "0.03"),
        "spec-500s": ("--fail-rate", "0.03", "--fail-status", "500", "--cut-rate", "0.03"),
        "spec-killed": (),
        "spec-sick": ("--fail-rate", "1.0", "--fail-status", "503"),
    }
    STD = {
        "std-429s": ("--fail-rate", "0.05", "--fail-status", "429", "--slow-rate", "0.02",
                     "--slow-seconds", str(SLOW_S)),
        "std-killed": (),
        "std-cuts": ("--cut-rate", "0.04"),
    }

    def __init__(self, records: Path) -> None:
        self.records = records
        self.spec = {name: self._fake(name, "speculative", faults) for name, faults in self.SPEC.items()}
        self.std = {name: self._fake(name, "standard", faults) for name, faults in self.STD.items()}
        self.all = {**self.spec, **self.std}
        self.killable = [self.spec["spec-killed"], self.std["std-killed"]]

    def _fake(self, name: str, kind: str, faults: tuple[str, ...]) -> FakeVllmProcess:
        seed = str(sum(map(ord, name)))
        return FakeVllmProcess("--kind", kind, "--seed", seed, *STREAM, *faults,
                               "--record", str(self.records / f"{name}.json"))

    def start(self) -> None:
        with ThreadPoolExecutor(len(self.all)) as pool:
            list(pool.map(lambda fake: fake.start(30.0), self.all.values()))

    def stop(self) -> dict[str, dict]:
        """Terminate every fake; what each recorded (arrivals, faults dealt)."""
        with ThreadPoolExecutor(len(self.all)) as pool:
            list(pool.map(lambda fake: fake.terminate(), self.all.values()))
        paths = {name: self.records / f"{name}.json" for name in self.all}
        return {name: json.loads(path.read_text()) for name, path in paths.items() if path.exists()}

    def policy(self) -> dict:
        def pool(kind: str, fakes: dict[str, FakeVllmProcess], **extra) -> dict:
            endpoints = [{"url": f.url, **({"max_in_flight": 1} if name == "spec-sick" else {})}
                         for name, f in fakes.items()]
            return {"kind": kind, "endpoints": endpoints, "model": "fake-model", "timeouts": TIMEOUTS,
                    "health": HEALTH, "connections": {"keepalive_expiry_s": 1.0}, **extra}

        return {
            "version": 1,
            "pools": {"speculative": pool("speculative", self.spec, fallback="standard"),
                      "standard": pool("standard", self.std)},
            "rules": [{"name": "hot-sampling", "when": {"temperature": {"gt": 1.0}}, "route": "standard"},
                      {"name": "default", "route": "speculative"}],
            "guard": {"enabled": False},
        }


class Chaos:
    """Kills one of `targets` (SIGKILL), leaves it down for `down_s`, restarts it; repeat."""

    def __init__(self, targets: list[FakeVllmProcess], period_s: float = 1.5, down_s: float = 0.5,
                 max_kills: int = 200) -> None:
        self.targets = targets
        self.period_s = period_s
        self.down_s = down_s
        self.max_kills = max_kills
        self.kills = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        while self.kills < self.max_kills and not self.stop.is_set():
            if await self._sleep(self.period_s):
                return
            target = self.targets[self.kills % len(self.targets)]
            target.kill()
            self.kills += 1
            await self._sleep(self.down_s)
            await asyncio.to_thread(target.start, 30.0)

    async def _sleep(self, seconds: float) -> bool:
        """Sleep; True if told to stop meanwhile."""
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False


def settle(gateway: GatewayProcess, fd_limit: int | None = None, seconds: float = 15.0) -> tuple[int, int]:
    """Let idle connections close (the fakes drop them after 5 s); then (rss, fds)."""
    deadline = time.monotonic() + seconds
    time.sleep(6.0)
    while fd_limit is not None and gateway.open_fds() > fd_limit and time.monotonic() < deadline:
        time.sleep(0.5)
    return gateway.rss_bytes(), gateway.open_fds()


def summary(report: LoadReport, records: dict[str, dict], kills: int, before: tuple[int, int],
            after: tuple[int, int], run_s: float) -> dict:
    faults: dict[str, int] = {"kill_restart": kills}
    for name, record in records.items():
        for kind, count in record["faults"].items():
            faults[f"{name}:{kind}"] = count
    return {
        "requests": report.requests,
        "concurrency": CONCURRENCY,
        "outcomes": dict(sorted(report.outcomes.items(), key=lambda kv: -kv[1])),
        "faults_injected": faults,
        "latency_p50_s": round(report.percentile(0.50), 4),
        "latency_p99_s": round(report.percentile(0.99), 4),
        "latency_max_s": round(max(report.durations), 4),
        "load_elapsed_s": round(report.elapsed_s, 1),
        "requests_per_s": round(report.requests / report.elapsed_s, 1),
        "rss_mib": [round(before[0] / 2**20, 1), round(after[0] / 2**20, 1)],
        "open_fds": [before[1], after[1]],
        "sick_endpoint_requests": len(records.get("spec-sick", {}).get("arrivals", [])),
        "test_run_s": round(run_s, 1),
    }


def started_backends(directory: Path) -> tuple[Backends, Path]:
    """The faulty backends, started, and a policy file in `directory` that routes to them."""
    backends = Backends(directory)
    backends.start()
    policy = directory / "policy.yaml"
    policy.write_text(yaml.safe_dump(backends.policy(), sort_keys=False))
    return backends, policy


def test_soak_with_faults(tmp_path):
    began = time.monotonic()
    backends, policy = started_backends(tmp_path)
    gateway = GatewayProcess(policy, tmp_path / "gateway.log")
    try:
        gateway.start()
        warmup = asyncio.run(run_load(gateway.url, WARMUP_REQUESTS, CONCURRENCY, CLIENT_TIMEOUT_S, seed=1))
        assert not warmup.violations(), warmup.outcomes
        start_rss, start_fds = settle(gateway)

        async def soak() -> tuple[LoadReport, int]:
            chaos = Chaos(backends.killable)
            chaos_task = asyncio.create_task(chaos.run())
            try:
                return await run_load(gateway.url, REQUESTS, CONCURRENCY, CLIENT_TIMEOUT_S, seed=2,
                                      abandon_rate=ABANDON_RATE), chaos.kills
            finally:
                chaos.stop.set()
                await chaos_task

        report, kills = asyncio.run(soak())
        end_rss, end_fds = settle(gateway, fd_limit=start_fds + FD_GROWTH_LIMIT)
        in_flight = gateway.samples("specgate_in_flight")
        gateway_counts = {"retries": gateway.samples("specgate_retries_total"),
                          "upstream_errors": gateway.samples("specgate_upstream_errors_total")}
    finally:
        exit_status = gateway.stop()
        records = backends.stop()
    result = summary(report, records, kills, (start_rss, start_fds), (end_rss, end_fds),
                     time.monotonic() - began)
    result["gateway_counted"] = gateway_counts
    print("\nsoak summary:", json.dumps(result, indent=1))
    if os.environ.get("SOAK_REPORT"):
        Path(os.environ["SOAK_REPORT"]).write_text(json.dumps(result, indent=1))

    assert report.requests == REQUESTS
    assert report.violations() == {}, result["outcomes"]
    assert kills >= 2 and sum(v for k, v in result["faults_injected"].items() if k != "kill_restart") > 0
    assert in_flight and all(value == 0 for value in in_flight.values()), in_flight
    assert backoff_violations(records["spec-sick"]["arrivals"], HEALTH) == []
    assert end_rss - start_rss < RSS_GROWTH_LIMIT, result["rss_mib"]
    assert end_fds <= start_fds + FD_GROWTH_LIMIT, result["open_fds"]
    log = gateway.log()
    assert "unhandled_error" not in log and "Traceback" not in log, log[-3000:]
    assert exit_status in (0, -15), log[-2000:]
