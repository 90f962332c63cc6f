"""Compile the gateway's request path to C with mypyc (optional: `specgate serve` uses the
build while it matches the sources, and the sources otherwise)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="where the build goes (default: build/compiled beside the "
                        "gateway package; `specgate serve --compiled-dir` reads another)")
    parser.add_argument("--verbose", action="store_true", help="show mypyc's and the C compiler's output")


def run(args: argparse.Namespace) -> int:
    from specgate.compiled import build_compiled, compiled_sources, default_build_dir, source_root

    root = source_root()
    out = args.out or default_build_dir(root)
    print(f"compiling {len(compiled_sources(root))} modules of the request path with mypyc into {out} "
          "(several minutes on 2 cores)...", file=sys.stderr)
    started = time.monotonic()
    try:
        modules = build_compiled(out, root, verbose=args.verbose)
    except (Exception, SystemExit) as exc:  # mypyc reports errors by SystemExit; a missing compiler by CompileError
        print(f"specgate compile: the build failed ({exc.__class__.__name__}: {exc}); `specgate serve` runs the "
              "sources. --verbose shows why.", file=sys.stderr)
        return 1
    print(f"{len(modules)} modules compiled in {time.monotonic() - started:.0f} s: {out}", file=sys.stderr)
    return 0
