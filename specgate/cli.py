"""The `specgate` command: the parser of every subcommand in `specgate.commands`.

Each subcommand is a module there that defines `add_arguments(parser)` and
`run(args) -> int`, listed in `COMMANDS`. Those modules keep heavy imports
(torch, vLLM, uvicorn) inside `run`, so `specgate --help` stays instant.

A command that fails says why in one line on stderr and exits 1, the way the
gateway answers bad input with an error envelope: no traceback unless
SPECGATE_LOG_LEVEL=debug asks for one.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from specgate import __version__
from specgate.commands import COMMANDS


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
            description=summary(module.__doc__ or help_text),
        )
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def summary(doc: str) -> str:
    """A docstring's first paragraph on one line: what `--help` says a command does."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def describe(exc: BaseException) -> str:
    """One line that tells a user what went wrong, from any exception."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.strerror}: {exc.filename}"
    message = " ".join(str(exc).split()) or type(exc).__name__
    try:  # httpx errors know the URL they were about
        url = exc.request.url  # type: ignore[attr-defined]  # duck-typed: any error that carries a request
    except (AttributeError, RuntimeError):
        return message
    return f"{message} ({url})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("SPECGATE_LOG_LEVEL", "").lower() == "debug":
            raise
        print(f"specgate {args.command}: {describe(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
