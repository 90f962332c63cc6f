"""The processes of the affinity benchmarks, as `specgate up` runs its own.

Backends (simulated or real vLLM replicas) and the gateway are `Service`s of
specgate/up.py: each under a lifeline, in a process group of its own, stopped
with SIGTERM then SIGKILL. The gateway holds one standard pool of all the
replicas, every request routed to it (bench/routing/stack.py's `fixed_policy`),
and only the pool's `balance:` (and `affinity:`) changes between arms.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from bench.routing.stack import fixed_policy
from gateway.policy.kinds import PoolKind
from specgate import replicas
from specgate.replicas import vllm_backend
from specgate.up import SERVED_MODEL, Service, gateway_service, stop_all, wait_healthy
from tests.fakes.process import free_port


def pool_policy(urls: list[str], balance: str, affinity: dict[str, Any] | None) -> dict[str, Any]:
    """One standard pool of `urls`, every request routed to it, balanced by `balance`."""
    from gateway.policy.pools import PoolSpec

    policy = fixed_policy("standard", urls)
    if "balance" not in PoolSpec.model_fields:
        if balance != "least_outstanding":
            raise SystemExit("this gateway has no `balance:` in its pools; only least_outstanding can run")
        return policy  # today's choice, the only one
    policy["pools"]["standard"]["balance"] = balance
    if balance == "prefix" and affinity:
        policy["pools"]["standard"]["affinity"] = affinity
    return policy


def sim_replicas(count: int, work: Path, sim_args: list[str]) -> list[Service]:
    """`count` simulated standard replicas serving the model name the policy asks for."""
    services = []
    for seed in range(1, count + 1):
        port = free_port()
        argv = [sys.executable, "-m", "specgate.cli", "sim", "--kind", "standard", "--port", str(port),
                "--model", SERVED_MODEL, "--seed", str(seed), *sim_args]  # fmt: skip
        services.append(Service(f"sim {seed} (:{port})", argv, f"http://127.0.0.1:{port}/health",
                                work / f"sim-{seed}.log", grace_s=5))  # fmt: skip
    return services


def vllm_replicas(count: int, model_dir: Path, work: Path) -> list[Service]:
    """`count` vLLM CPU servers of the `standard` profile, as `specgate up` starts them;
    dev mode on for `POST /reset_prefix_cache` between runs."""
    services = []
    for index in range(1, count + 1):
        port = free_port()
        standard = vllm_backend(replicas.Replica(f"standard-{index}", PoolKind.STANDARD, port), model_dir,
                                work / f"vllm-{index}")
        standard.env["VLLM_SERVER_DEV_MODE"] = "1"
        services.append(standard)
    return services


def url_of(service: Service) -> str:
    return f"http://127.0.0.1:{service.port}"


def start(services: list[Service], timeout_s: float) -> None:
    """Start `services` together and wait until each is healthy; stop them all if one fails."""
    try:
        for service in services:
            service.start()
        wait_healthy(services, timeout_s, say)
    except BaseException:
        stop_all(services, say)
        raise


def start_gateway(urls: list[str], balance: str, affinity: dict[str, Any] | None, work: Path) -> Service:
    """`specgate serve` over the replicas at `urls`, their pool balanced by `balance`, started and ready."""
    path = work / f"policy-{balance}.yaml"
    path.write_text(yaml.safe_dump(pool_policy(urls, balance, affinity)))
    gateway = gateway_service(path, free_port(), work / f"gateway-{balance}")
    start([gateway], 180.0)
    return gateway


def say(line: str) -> None:
    print(line, flush=True)
