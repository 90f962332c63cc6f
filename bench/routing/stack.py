"""Two pool simulators and a gateway in front of them, for one way of serving.

Every way gets the same hardware, two simulated replicas, and the same proxy:

- gateway: the replicas `policies/default.yaml` (or `--gateway-policy`)
  describes, one simulator of the pool's kind per endpoint it lists, the
  policy used untouched but for the endpoint URLs;
- speculative, standard, dynamic: both replicas of that kind as ONE pool of two
  endpoints behind the same gateway, every request routed to it by a fixed rule
  (the pool's endpoint choice balances the two), guard off.

Each way starts fresh (new simulators, new gateway) and is stopped after.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.fakes.process import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2"  # default.yaml's upstream model name; the simulators serve it under that name
WAYS: dict[str, tuple[str, str]] = {
    "gateway": ("speculative", "standard"),
    "speculative": ("speculative", "speculative"),
    "standard": ("standard", "standard"),
    "dynamic": ("dynamic", "dynamic"),
}


@dataclass
class Stack:
    url: str  # the gateway
    sims: list[str]  # the replicas, where control events go
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def default_policy() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    return loaded


def drafting_pools(policy: dict[str, Any]) -> frozenset[str]:
    """The pools of `policy` whose kind drafts (what a collapsed domain should leave)."""
    from gateway.policy.kinds import KINDS, PoolKind

    return frozenset(name for name, pool in policy["pools"].items() if KINDS[PoolKind(pool["kind"])].reports_acceptance)


def replica_kinds(policy: dict[str, Any]) -> list[tuple[str, list[list[int]] | None]]:
    """One (kind, stated schedule) per endpoint the policy lists, pool by pool: the replicas its
    gateway way runs on, a dynamic one drafting by its pool's `speculation_schedule`."""
    return [(pool["kind"], pool.get("speculation_schedule")) for pool in policy["pools"].values()
            for _ in pool["endpoints"]]


def gateway_policy(policy: dict[str, Any], urls: list[str]) -> dict[str, Any]:
    """`policy` with its pools' endpoints pointed at `urls`, in the order `replica_kinds` gives.
    A pool's `model` (the name a GPU fleet serves) is dropped: the simulators serve the replay's own."""
    policy = copy.deepcopy(policy)
    remaining = iter(urls)
    for pool in policy["pools"].values():
        pool["endpoints"] = [{"url": next(remaining)} for _ in pool["endpoints"]]
        pool.pop("model", None)
    return policy


def sim_schedule(sim_args: list[str]) -> list[list[int]]:
    """The drafting schedule of a dynamic simulator started with `sim_args`, as a dynamic pool states
    it: its calibration's draft tokens up to its `speculative_max_batch`, none above (a schedule's
    last range holds for every larger batch, so the stop is a range of its own)."""
    from backends.sim.model import CALIBRATIONS, schedule

    calibration = "8b-a100"
    if "--calibration" in sim_args:
        calibration = sim_args[sim_args.index("--calibration") + 1]
    return schedule(CALIBRATIONS[calibration]).as_list()


def fixed_policy(kind: str, urls: list[str], schedule: list[list[int]] | None = None) -> dict[str, Any]:
    """One pool of `urls`, every request routed to it, the rest as default.yaml's standard pool."""
    policy = default_policy()
    pool = copy.deepcopy(policy["pools"]["standard"])
    pool["endpoints"] = [{"url": url} for url in urls]
    pool["kind"] = kind
    if kind == "dynamic":  # what the simulators' switch does: draft up to their speculative_max_batch
        pool["speculation_schedule"] = schedule or [[1, 32, 3], [33, 33, 0]]
    policy["pools"] = {kind: pool}
    policy["default_pool"] = kind
    policy["rules"] = [{"name": "fixed", "route": kind, "reason": f"always {kind}"}]
    policy["guard"] = {"enabled": False}
    return policy


def _spawn(args: list[str], log: Path | None = None) -> subprocess.Popen[bytes]:
    err = log.open("w") if log else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "specgate.cli", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=err)


def start(way: str, work: Path, time_scale: float, sim_args: list[str],
          gateway: dict[str, Any] | None = None) -> Stack:
    """`gateway`: the gateway way's policy (default.yaml when None)."""
    gateway = gateway or default_policy()
    kinds = replica_kinds(gateway) if way == "gateway" else [(kind, None) for kind in WAYS[way]]
    procs, urls = [], []
    for seed, (kind, schedule) in enumerate(kinds, 1):
        port = free_port()
        stated = [] if schedule is None else ["--speculation-schedule", json.dumps(schedule)]
        procs.append(_spawn(["sim", "--kind", kind, "--port", str(port), "--model", MODEL,
                             "--time-scale", str(time_scale), "--seed", str(seed), *sim_args, *stated]))
        urls.append(f"http://127.0.0.1:{port}")
    policy = gateway_policy(gateway, urls) if way == "gateway" else fixed_policy(way, urls, sim_schedule(sim_args))
    path = work / f"policy-{way}.yaml"
    path.write_text(yaml.safe_dump(policy))
    port = free_port()
    procs.append(_spawn(["serve", "--policy", str(path), "--port", str(port)], work / f"gateway-{way}.log"))
    stack = Stack(f"http://127.0.0.1:{port}", urls, procs)
    try:
        _wait_ready([(url, "/health") for url in urls] + [(stack.url, "/readyz")], procs, work / f"gateway-{way}.log")
    except RuntimeError:
        stack.stop()
        raise
    return stack


def _wait_ready(targets: list[tuple[str, str]], procs: list[subprocess.Popen[bytes]], log: Path) -> None:
    """Each target answering 200 on its path, in turn; its process (the same place in `procs`)
    exiting first ends the wait at once. A simulator's stderr is dropped; the gateway's is `log`."""
    deadline = time.monotonic() + 90
    for (url, path), proc in zip(targets, procs, strict=True):
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{url} exited with status {proc.returncode} before it was ready "
                                   f"(the gateway's log: {log})")
            try:
                if httpx.get(url + path, timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not start")
            time.sleep(0.2)
