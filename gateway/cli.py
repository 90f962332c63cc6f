"""The `specgate` command.

Every subcommand lives in a module of its own that defines
`add_arguments(parser)` and `run(args) -> int`. Those modules keep heavy imports
(torch, vLLM, uvicorn) inside `run`, so `specgate --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gateway import __version__

# (name, module, one-line help)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("serve", "gateway.commands.serve", "run the gateway"),
    ("check", "gateway.commands.check", "validate a policy file"),
    ("explain", "gateway.commands.explain", "print the routing decision for a request"),
    ("sim", "backends.sim.command", "run a simulated vLLM pool (speculative or standard)"),
    ("engine", "backends.engine.cli", "run the bundled speculative engine (OpenAI API, vLLM metrics)"),
    ("bench", "gateway.ops.bench", "benchmark OpenAI-compatible URLs (TTFT, TPOT, E2E, throughput)"),
    ("baseline", "gateway.ops.baseline_cmd", "record the latency baseline the guard compares against"),
    ("report", "gateway.ops.report", "weekly operations report from Prometheus (acceptance, speedup, fallbacks)"),
    ("tune", "gateway.ops.tune", "sweep a speculative profile's draft length and recommend the fastest"),
    ("up", "backends.up", "start the bundled backends and the gateway on this machine"),
    ("model", "backends.model", "prepare the packaged SmolLM2 model for vLLM"),
    ("check-draft", "backends.vllm.check_draft", "check that a draft model's tokenizer matches the target's"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specgate",
        description="OpenAI-compatible gateway that sends each request to a "
        "speculative-decoding or a standard backend pool.",
    )
    parser.add_argument("--version", action="version", version=f"specgate {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name, help_text in COMMANDS:
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(
            name,
            help=help_text,
            description=(module.__doc__ or help_text).strip().splitlines()[0],
        )
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
