"""Soak, fleet variant: three `specgate serve --workers 2` replicas sharing a
real Redis that is killed and restarted over and over, in front of the same
faulty backends as the single-process soak (tests/soak/test_soak.py).

The load is split over the three replicas. The promises are those of the
single-process soak, for every one of the six worker processes: every request
ends in a complete answer or an OpenAI error within its timeout; nothing
stays in flight; memory and open files come back to where they were after a
warm-up; no traceback; a clean exit on SIGTERM. The store adds its own: no
request fails because Redis is down, and once it is back every worker says
`specgate_state_up 1` again. Endpoint ejection is each process's own, so the
sick endpoint may see one trial per back-off from each of the six.

    SOAK_REQUESTS=3000 pytest tests/soak/test_soak_fleet.py -s
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.fakes.redis_server import RedisServer
from tests.integration.state.workers import ServeWorkers
from tests.soak.load import LoadReport, run_load
from tests.soak.test_soak import (
    ABANDON_RATE,
    CLIENT_TIMEOUT_S,
    FD_GROWTH_LIMIT,
    HEALTH,
    RSS_GROWTH_LIMIT,
    Chaos,
    started_backends,
)

pytestmark = [pytest.mark.soak, pytest.mark.timeout(600)]

REPLICAS, WORKERS = 3, 2
REQUESTS = int(os.environ.get("SOAK_REQUESTS", "10000"))
WARMUP_REQUESTS = 600
CONCURRENCY = 84  # per replica: 252 in all, as the single-process soak's 256
SCRAPES = 16  # per replica, each on a new connection: every worker is seen (1 - 2^-15)
SAMPLE = re.compile(r'^(specgate_\w+)(?:\{[^}]*\})? (\S+)$', re.MULTILINE)


def scrape(url: str, metric: str) -> list[list[float]]:
    """`metric`'s values in each of SCRAPES scrapes of `url`, each answered by whichever worker took it."""
    values = []
    for _ in range(SCRAPES):
        text = httpx.get(f"{url}/metrics", headers={"Connection": "close"}, timeout=10).text
        values.append([float(v) for name, v in SAMPLE.findall(text) if name == metric])
    return values


def usage(pids: set[int]) -> dict[int, tuple[int, int]]:
    """(resident bytes, open files) of each process."""
    result = {}
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = re.search(r"^VmRSS:\s+(\d+) kB$", status, re.MULTILINE)
        assert rss is not None
        result[pid] = (int(rss.group(1)) * 1024, len(os.listdir(f"/proc/{pid}/fd")))
    return result


def settled(pids: set[int], before: dict[int, tuple[int, int]] | None = None) -> dict[int, tuple[int, int]]:
    """Let idle connections close (the fakes drop them after 5 s); then every worker's usage."""
    time.sleep(6.0)
    deadline = time.monotonic() + 15.0
    while before and time.monotonic() < deadline and any(
            fds > before[pid][1] + FD_GROWTH_LIMIT for pid, (_, fds) in usage(pids).items()):
        time.sleep(0.5)
    return usage(pids)


async def load_all(urls: list[str], total: int, seed: int, abandon_rate: float = 0.0) -> LoadReport:
    """`total` requests split over `urls`, each with its own CONCURRENCY clients; one report."""
    parts = await asyncio.gather(*(run_load(url, total // len(urls), CONCURRENCY, CLIENT_TIMEOUT_S,
                                            seed=seed * 10 + i, abandon_rate=abandon_rate)
                                   for i, url in enumerate(urls)))
    merged = LoadReport(elapsed_s=max(p.elapsed_s for p in parts))
    for part in parts:
        merged.outcomes.update(part.outcomes)
        merged.durations.extend(part.durations)
    return merged


def wait_state_up(urls: list[str], timeout: float = 60.0) -> None:
    """Until every scrape of every replica says specgate_state_up 1 (a hang guard bounds it)."""
    deadline = time.monotonic() + timeout
    while any(values != [1.0] for url in urls for values in scrape(url, "specgate_state_up")):
        assert time.monotonic() < deadline, "the workers did not see the store again"
        time.sleep(0.5)


def test_fleet_soak_with_faults_and_redis_restarts(tmp_path):
    began = time.monotonic()
    backends, policy = started_backends(tmp_path)
    redis = RedisServer(tmp_path / "redis").start()
    env = {"SPECGATE_STATE_URL": redis.url}
    replicas = [ServeWorkers(policy, tmp_path / f"serve-{i}.log", WORKERS, env) for i in range(REPLICAS)]
    urls = [replica.url for replica in replicas]
    try:
        pids = set().union(*(replica.wait_listening(WORKERS) for replica in replicas))
        warmup = asyncio.run(load_all(urls, WARMUP_REQUESTS, seed=1))
        assert not warmup.violations(), warmup.outcomes
        before = settled(pids)

        async def soak() -> tuple[LoadReport, int, int]:
            chaos = Chaos(backends.killable)
            store_chaos = Chaos([redis], period_s=4.0, down_s=1.5)
            tasks = [asyncio.create_task(chaos.run()), asyncio.create_task(store_chaos.run())]
            try:
                return await load_all(urls, REQUESTS, seed=2, abandon_rate=ABANDON_RATE), \
                    chaos.kills, store_chaos.kills
            finally:
                chaos.stop.set()
                store_chaos.stop.set()
                await asyncio.gather(*tasks)

        report, kills, store_restarts = asyncio.run(soak())
        wait_state_up(urls)
        after = settled(pids, before)
        in_flight = [value for url in urls for values in scrape(url, "specgate_in_flight") for value in values]
    finally:
        for replica in replicas:
            replica.stop()
        exits = [replica.process.returncode for replica in replicas]
        redis.stop()
        records = backends.stop()
    result = {"requests": report.requests, "outcomes": dict(report.outcomes.most_common()),
              "backend_kills": kills, "redis_restarts": store_restarts,
              "latency_p50_s": round(report.percentile(0.5), 4), "latency_p99_s": round(report.percentile(0.99), 4),
              "requests_per_s": round(report.requests / report.elapsed_s, 1),
              "rss_mib": {pid: [round(before[pid][0] / 2**20, 1), round(after[pid][0] / 2**20, 1)] for pid in pids},
              "open_fds": {pid: [before[pid][1], after[pid][1]] for pid in pids},
              "sick_endpoint_requests": len(records["spec-sick"]["arrivals"]),
              "test_run_s": round(time.monotonic() - began, 1)}
    print("\nfleet soak summary:", json.dumps(result, indent=1))

    assert report.requests == REQUESTS - REQUESTS % REPLICAS
    assert report.violations() == {}, result["outcomes"]
    assert kills >= 2 and store_restarts >= 2
    assert in_flight and all(value == 0 for value in in_flight)
    for pid in pids:
        assert after[pid][0] - before[pid][0] < RSS_GROWTH_LIMIT, result["rss_mib"]
        assert after[pid][1] <= before[pid][1] + FD_GROWTH_LIMIT, result["open_fds"]
    # each of the six processes ejects on its own: eject_after failures, then one trial per back-off
    trials = REPLICAS * WORKERS * (HEALTH["eject_after"] + 1 + result["test_run_s"] / HEALTH["backoff_s"])
    assert result["sick_endpoint_requests"] <= trials
    for replica in replicas:
        log = replica.log.read_text(errors="replace")
        assert "unhandled_error" not in log and "Traceback" not in log, log[-3000:]
    assert exits == [0] * REPLICAS
