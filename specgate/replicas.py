"""The local replicas `specgate up` starts for a policy: one backend per pool,
of the pool's kind, and the policy pointed at them as they run.

A pool's kind names the launch profile family that serves it (its row in
gateway/policy/kinds.py): a standard pool gets a plain server, a drafting one
the drafting profile, a dynamic one that profile with the pool's own
schedule. Each pool takes the next port from FIRST_BACKEND_PORT, or the one
given, in the policy's order.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.policy.kinds import KINDS, PoolKind
from specgate.up import SERVED_MODEL, Service, StartError

SPECULATIVE_PORT, STANDARD_PORT = 8001, 8002  # the default's pair
FIRST_BACKEND_PORT = SPECULATIVE_PORT  # the first pool's backend; each next pool's the next port
VLLM_CPU_ARGS = ("--dtype", "float32", "--max-model-len", "2048")  # float32: greedy stays exact
DEFAULT_SPECULATIVE_PROFILE = "speculative-eagle3-local"  # ahead of n-gram on every class (docs/drafts.md)


@dataclass(frozen=True)
class Replica:
    """One pool of the policy as `up` runs it: a local backend of its own on
    `port`, of the kind it runs as; `schedule` is a dynamic replica's, in
    vLLM's format (`[[lo, hi, k], ...]`)."""

    pool: str
    kind: PoolKind
    port: int
    schedule: list[list[int]] | None = None

    @property
    def family(self) -> str:
        """The launch profile family that serves it (its kind's row in gateway/policy/kinds.py)."""
        return KINDS[self.kind].profile

    @property
    def slug(self) -> str:
        """The pool's name as a file name: whatever a policy names a pool, its log stays in the log folder."""
        return _file_name(self.pool)


def _file_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip(".") or "_"


def fleet(policy: Path, ports: Sequence[int] | None = None, speculative_profile: str | None = None
          ) -> list[Replica]:
    """The replicas `up` starts for `policy`: one per pool, in the file's order,
    on `ports` (default FIRST_BACKEND_PORT, the next, ...). A pool that drafts at
    every batch, run by a profile with a schedule (a dynamic profile), runs as a
    dynamic replica with that schedule."""
    from backends.vllm import load_profiles
    from gateway.policy.loader import PolicyError, load_policy

    try:
        pools = load_policy(policy).pools
    except PolicyError as exc:
        raise StartError(str(exc)) from None
    if ports is None:
        ports = range(FIRST_BACKEND_PORT, FIRST_BACKEND_PORT + len(pools))
    if len(ports) != len(pools):
        raise StartError(f"{policy} has {len(pools)} pools ({', '.join(pools)}) and --backend-ports gives "
                         f"{len(ports)} ports: one port per pool, in the policy's order")
    _, profiles = load_profiles()
    chosen = profiles.get(speculative_profile) if speculative_profile else None
    profile_schedule = None if chosen is None or chosen.speculation_schedule is None \
        else chosen.speculation_schedule.as_list()
    replicas = []
    for (name, pool), port in zip(pools.items(), ports, strict=True):
        kind, schedule = pool.kind, pool.speculation_schedule
        if KINDS[kind].profile == "speculative" and profile_schedule is not None:
            kind, schedule = PoolKind.DYNAMIC, profile_schedule
        replicas.append(Replica(name, kind, port, schedule))
    return replicas


def policy_for(policy: Path, replicas: Sequence[Replica], into: Path, batch_cap: int | None = None) -> Path:
    """`policy` as `up` runs it: each pool pointed at its replica's backend, and
    stated as the replica runs (a pool run by a dynamic profile: `kind: dynamic`
    with the profile's schedule), so the latency model predicts each replica as
    it drafts; with a `batch_cap` (the backends' own, where the policy's is
    higher or unset), requests past it wait in the gateway's queue, where
    deadlines apply, not the backend's. `policy` itself where nothing differs;
    else a copy under `into`."""
    import yaml

    from gateway.policy.loader import load_policy

    pools = load_policy(policy).pools

    def capped(pool: str) -> int | None:
        given = pools[pool].max_in_flight
        return batch_cap if batch_cap is not None and (given is None or given > batch_cap) else None

    if all([e.url for e in pools[r.pool].endpoints] == [_local(r.port)] and pools[r.pool].kind == r.kind
           and capped(r.pool) is None for r in replicas):
        return policy
    data = yaml.safe_load(policy.read_text(encoding="utf-8"))
    for replica in replicas:
        pool = data["pools"][replica.pool]
        pool["endpoints"] = [{"url": _local(replica.port)}]
        if pool["kind"] != replica.kind:
            pool.update(kind=str(replica.kind), speculation_schedule=replica.schedule)
        if (cap := capped(replica.pool)) is not None:
            pool["max_in_flight"] = cap
    ports = "-".join(str(r.port) for r in replicas)
    restated = sorted({r.pool for r in replicas if pools[r.pool].kind != r.kind})
    into.mkdir(parents=True, exist_ok=True)
    derived = into / f"{_file_name(policy.stem)}-{ports}.yaml"
    derived.write_text(f"# {policy.name} as `specgate up` runs it: pools on ports {', '.join(ports.split('-'))}"
                       + (f"; {', '.join(restated)} stated as the dynamic profile runs" if restated else "")
                       + "\n" + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return derived


def _local(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def vllm_backend(replica: Replica, model_dir: Path, logs: Path, python: str = sys.executable,
                 speculative_profile: str = DEFAULT_SPECULATIVE_PROFILE) -> Service:
    """A vLLM CPU server for `replica`: the `standard` profile where its kind never
    drafts, else `speculative_profile`'s drafter; a replica with a schedule
    drafts by it, as deep as its deepest step (the profile's depth is an
    always-drafting replica's)."""
    from backends.speculation import SpeculationSchedule
    from backends.vllm import load_profiles, render
    from backends.vllm.heads import HeadNotFound

    _, profiles = load_profiles()
    if replica.family == "standard":
        profile = profiles["standard"]
    elif speculative_profile in profiles and profiles[speculative_profile].speculative:
        profile = profiles[speculative_profile]
    else:
        choices = ", ".join(sorted(name for name, p in profiles.items() if p.speculative))
        raise StartError(f"unknown speculative profile {speculative_profile!r}; choose one of: {choices}")
    spec_config: dict[str, object] | None = None
    if replica.schedule is not None:
        spec_config = {"num_speculative_tokens_per_batch_size": replica.schedule}
        if deepest := SpeculationSchedule.parse(replica.schedule).max_tokens():  # vLLM caps each step at this
            spec_config["num_speculative_tokens"] = deepest
    try:
        argv = render(profile, model=str(model_dir), port=replica.port, served_model_name=SERVED_MODEL,
                      spec_config=spec_config, extra_args=VLLM_CPU_ARGS, python=python)
    except HeadNotFound as exc:
        raise StartError(f"profile {profile.name}: {exc}") from exc
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "HF_HUB_OFFLINE": "1"}
    return Service(f"vLLM {replica.pool} ({profile.name}, :{replica.port})", argv,
                   f"{_local(replica.port)}/health", logs / f"vllm-{replica.slug}.log", env)


def vllm_backends(model_dir: Path, logs: Path, ports: tuple[int, int] = (SPECULATIVE_PORT, STANDARD_PORT),
                  python: str = sys.executable, speculative_profile: str = DEFAULT_SPECULATIVE_PROFILE
                  ) -> list[Service]:
    """The default's pair, a speculative and a standard vLLM server on `ports`."""
    pair = (Replica("speculative", PoolKind.SPECULATIVE, ports[0]), Replica("standard", PoolKind.STANDARD, ports[1]))
    return [vllm_backend(replica, model_dir, logs, python, speculative_profile) for replica in pair]


def engine_backend(replica: Replica, logs: Path, python: str = sys.executable) -> Service:
    """The project's own engine for `replica`: plain where its kind never drafts,
    and drafting by the replica's schedule where it has one."""
    flags = ["--no-speculation"] if replica.family == "standard" else []
    if replica.schedule is not None:
        flags += ["--speculation-schedule", json.dumps(replica.schedule)]
    argv = [python, "-m", "specgate.cli", "engine", "--host", "127.0.0.1", "--port", str(replica.port),
            "--served-model-name", SERVED_MODEL, *flags]
    return Service(f"engine {replica.pool} (:{replica.port})", argv, f"{_local(replica.port)}/health",
                   logs / f"engine-{replica.slug}.log", {"HF_HUB_OFFLINE": "1"})


def command_backend(template: str, replica: Replica, logs: Path, python: str = sys.executable) -> Service:
    """A backend from a command line of your own; {python}, {port}, {kind} and {pool} are filled in."""
    argv = [part.format(python=python, port=replica.port, kind=replica.kind, pool=replica.pool)
            for part in shlex.split(template)]
    return Service(f"{replica.pool} backend (:{replica.port})", argv, f"{_local(replica.port)}/health",
                   logs / f"backend-{replica.slug}.log")
