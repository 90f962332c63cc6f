"""Prefix affinity at GPU scale: many simulated replicas of one pool behind the gateway.

Each run starts fresh simulators (`specgate sim --kind standard`, each with its
own prefix cache, docs/sim.md) and a gateway whose one pool holds them all,
every request routed to it; only the pool's `balance:` differs between arms.
The arms alternate run by run (A B, B A, ...), each pair on the same trace.

    python bench/affinity/sim_bench.py --replicas 8 --rounds 2

Writes bench/out/affinity/sim.json (every run and each arm pooled) and
sim-ttft-by-turn.png.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.affinity import rounds, stack, trace  # noqa: E402 - importable once the root is on sys.path
from bench.affinity.drive import Player, play  # noqa: E402 - as above
from specgate.up import SERVED_MODEL, stop_all  # noqa: E402 - as above

OUT = ROOT / "bench" / "out" / "affinity"
ARMS = ("least_outstanding", "prefix")


def run_arm(args: argparse.Namespace, arm: str, conversations: list[trace.Conversation], label: str,
            work: Path) -> rounds.Run:  # fmt: skip
    """Fresh replicas (empty caches) and a gateway balancing them by `arm`; one play of the trace."""
    replicas = stack.sim_replicas(args.replicas, work, ["--time-scale", str(args.time_scale), *args.sim_args])
    stack.start(replicas, 180.0)  # minutes when the machine is busy
    try:
        urls = [stack.url_of(r) for r in replicas]
        gateway = stack.start_gateway(urls, arm, args.affinity, work)
        try:
            player = Player(stack.url_of(gateway), SERVED_MODEL, args.max_tokens, {}, args.session_header)
            return asyncio.run(play(player, conversations, urls, label))
        finally:
            stop_all([gateway], stack.say)
    finally:
        stop_all(replicas, stack.say)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs, the arms' order alternating")
    parser.add_argument("--arms", default=",".join(ARMS), help="balance values, comma-separated")
    parser.add_argument("--conversations", type=int, default=trace.SIM_SHAPE.conversations)
    parser.add_argument("--rate", type=float, default=trace.SIM_SHAPE.arrival_rate, help="conversations a second")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=1.0, help="1.0 is the modelled GPU's speed")
    parser.add_argument("--sim-arg", action="append", default=[], help="passed to every `specgate sim`")
    parser.add_argument("--affinity", type=json.loads, default=None, help="the prefix arm's `affinity:` as JSON")
    parser.add_argument("--session-header", help="send each conversation's id in this header")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.sim_args = [part for arg in args.sim_arg for part in arg.split()]
    return args


def main() -> None:
    args = arguments()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="specgate-affinity-"))
    print(f"logs and policies: {work}", flush=True)
    shape = dataclasses.replace(trace.SIM_SHAPE, conversations=args.conversations, arrival_rate=args.rate)
    runs, results = rounds.interleaved(args.arms.split(","), args.rounds, shape, args.seed,
                                       lambda arm, convs, label: run_arm(args, arm, convs, label, work))
    setup = {"replicas": args.replicas, "rounds": args.rounds, "seed": args.seed, "shape": shape.__dict__,
             "max_tokens": args.max_tokens, "time_scale": args.time_scale, "sim_args": args.sim_args,
             "affinity": args.affinity}  # fmt: skip
    rounds.write(args.out, "sim", setup, runs, results, f"{args.replicas} simulated replicas")


if __name__ == "__main__":
    main()
