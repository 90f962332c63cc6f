"""`specgate model prepare`: the packaged SmolLM2-135M-Instruct as a folder vLLM loads.

How it is converted and where it is kept: `backends.model`.
"""

from __future__ import annotations

import argparse

from backends.model import MODEL_DIR_NAME, cache_dir, prepare


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    prep = sub.add_parser("prepare", help="convert the packaged GGUF into a cached safetensors folder, once")
    prep.add_argument("--cache-dir", help="default: $SPECGATE_CACHE_DIR or ~/.cache/specgate")
    sub.add_parser("path", help="print where the prepared model lives (whether or not it exists)")


def run(args: argparse.Namespace) -> int:
    if args.action == "path":
        print(cache_dir(getattr(args, "cache_dir", None)) / "models" / MODEL_DIR_NAME)
        return 0
    print(prepare(args.cache_dir))
    return 0
