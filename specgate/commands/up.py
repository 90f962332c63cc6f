"""`specgate up`: the embedded default, the whole stack on this machine.

What it starts: `specgate.replicas`; how it watches and stops it: `specgate.up`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from backends.engine.options import MAX_NUM_SEQS
from specgate.replicas import (
    DEFAULT_SPECULATIVE_PROFILE,
    FIRST_BACKEND_PORT,
    command_backend,
    engine_backend,
    fleet,
    policy_for,
    vllm_backend,
)
from specgate.up import Stack, StartError, banner, gateway_service


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=["vllm", "bundled"], default="vllm",
                        help="backends: real vLLM CPU servers (default) or the project's own engine")
    parser.add_argument("--speculative-profile", default=DEFAULT_SPECULATIVE_PROFILE, metavar="PROFILE",
                        help="vLLM launch profile of the drafting pools (backends/vllm/profiles.yaml): the "
                        "default drafts with the EAGLE-3 head shipped for SmolLM2-135M-Instruct; a dynamic pool "
                        "drafts with it by the pool's own schedule; e.g. "
                        "speculative-ngram: prompt lookup, no draft weights, or dynamic-ngram: n-gram drafts "
                        "only while the batch is small (default: %(default)s; --engine vllm only)")
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default: %(default)s)")
    parser.add_argument("--policy", type=Path, help="the fleet to run: one local backend per pool, of the pool's "
                        "kind, each pool pointed at its backend and a speculative one stated dynamic with the "
                        "profile's schedule under a dynamic profile (default: policies/default.yaml)")
    parser.add_argument("--backend-ports", type=_ports, metavar="PORT,PORT,...",
                        help=f"the backends' ports, one per pool in the policy's order (default: {FIRST_BACKEND_PORT}, "
                        "the next, ...)")
    parser.add_argument("--cache-dir", help="prepared model and logs (default: $SPECGATE_CACHE_DIR or "
                        "~/.cache/specgate)")
    # Any server command in place of the backends ({python}, {port}, {kind}, {pool}); started,
    # watched and stopped by the same code as vLLM and the engine. For tests.
    parser.add_argument("--backend-command", help=argparse.SUPPRESS)


def _ports(text: str) -> tuple[int, ...]:
    parts = text.split(",")
    if not all(p.strip().isdigit() and 0 < int(p) < 65536 for p in parts):
        raise argparse.ArgumentTypeError(f"expected ports separated by commas like 8001,8002, got {text!r}")
    return tuple(int(p) for p in parts)


def run(args: argparse.Namespace) -> int:
    from backends.model import cache_dir, prepare
    from gateway.settings import default_policy_path

    cache = cache_dir(args.cache_dir)
    logs = cache / "logs"
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    try:
        given = args.policy or default_policy_path()
        profile = args.speculative_profile if args.engine == "vllm" and not args.backend_command else None
        replicas = fleet(given, args.backend_ports, profile)
        if args.backend_command:
            backends = [command_backend(args.backend_command, replica, logs) for replica in replicas]
        elif args.engine == "vllm":
            print("preparing the model (once) ...", flush=True)
            model = prepare(cache)
            backends = [vllm_backend(replica, model, logs, speculative_profile=args.speculative_profile)
                        for replica in replicas]
        else:
            backends = [engine_backend(replica, logs) for replica in replicas]
        engine_cap = MAX_NUM_SEQS if args.engine == "bundled" and not args.backend_command else None
        policy = policy_for(given, replicas, cache / "policies", engine_cap)
        stack = Stack(backends, gateway_service(policy, args.port, logs))
    except StartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"starting the backends (logs in {logs}) ...", flush=True)
    try:
        stack.start(progress=_say)
        print(banner(args.port), flush=True)
        stopped = stack.wait()
        print(f"{stopped.name} exited with code {stopped.exit_code()}; its log: {stopped.log}", file=sys.stderr)
        return 1
    except StartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop(progress=_say)


def _say(line: str) -> None:
    print(line, flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
