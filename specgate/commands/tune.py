"""Find the draft length that pays off on this hardware.

The sweep, interleaved against the standard server: `specgate.ops.tune`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="speculative-ngram",
                        help="speculative launch profile (default: %(default)s)")
    parser.add_argument("--values", type=_ints, default=[2, 4, 6],
                        help="num_speculative_tokens to try (default: 2,4,6)")
    parser.add_argument("--lookup-max", type=_ints, default=[],
                        help="n-gram profiles: prompt_lookup_max values to try with each (default: the profile's)")
    parser.add_argument("--requests", type=int, default=8, help="requests per candidate and per server")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=64, help="unless a prompt sets its own")
    parser.add_argument("--prompts", help="JSONL prompts (default: the built-in mixed set)")
    parser.add_argument("--port", type=int, default=8011,
                        help="standard server port; candidates use the next one (default: %(default)s)")
    parser.add_argument("--cache-dir", help="prepared model and logs (default: as `specgate up`)")
    parser.add_argument("--out", type=Path, default=Path("tune-out"), help="directory for tune.json")


def run(args: argparse.Namespace) -> int:
    from backends.vllm import load_profiles
    from specgate.ops.prompts import builtin_prompts, load_prompts
    from specgate.ops.tune import candidates, sweep, table, vllm_launcher

    _, profiles = load_profiles()
    profile = profiles.get(args.profile)
    if profile is None or not profile.speculative:
        speculative = sorted(name for name, p in profiles.items() if p.speculative)
        print(f"specgate tune: {args.profile!r} is not a speculative profile; choose one of {', '.join(speculative)}",
              file=sys.stderr)
        return 2
    if args.lookup_max and profile.speculative_config.get("method") != "ngram":
        print("specgate tune: --lookup-max applies to n-gram profiles only", file=sys.stderr)
        return 2
    prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts()
    result = sweep(vllm_launcher(args.profile, args.cache_dir), candidates(args.values, args.lookup_max), prompts,
                   requests=args.requests, concurrency=args.concurrency, max_tokens=args.max_tokens, port=args.port)
    result["profile"] = args.profile
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tune.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"recommended for {args.profile}: {json.dumps(result['recommended'])}" if result["recommended"]
          else "no candidate could be measured")
    print(f"wrote {args.out / 'tune.json'}")
    return 0 if result["recommended"] else 1
