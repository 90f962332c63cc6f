"""Start vLLM's OpenAI server from a launch profile (used by compose and Kubernetes).

    python -m backends.vllm.launch --profile speculative-ngram --port 8000 [-- extra vLLM args]

Environment overrides: SPECGATE_VLLM_MODEL (model), SPECGATE_VLLM_SPEC_CONFIG
(JSON merged into the speculative config), SPECGATE_VLLM_EXTRA_ARGS (appended flags).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence

from backends.vllm.profiles import load_profiles, render, split_args


def build_argv(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    default_model, profiles = load_profiles()
    parser = argparse.ArgumentParser(prog="python -m backends.vllm.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, choices=sorted(profiles))
    parser.add_argument("--model", default=env.get("SPECGATE_VLLM_MODEL") or default_model)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more vLLM flags")
    args = parser.parse_args(argv)
    spec_override = json.loads(env["SPECGATE_VLLM_SPEC_CONFIG"]) if env.get("SPECGATE_VLLM_SPEC_CONFIG") else None
    extra = [a for a in args.extra if a != "--"] + split_args(env.get("SPECGATE_VLLM_EXTRA_ARGS"))
    command = render(profiles[args.profile], model=args.model, host=args.host, port=args.port,
                     served_model_name=args.served_model_name, spec_config=spec_override, extra_args=extra)
    if args.dry_run:
        print(shlex.join(command))
        sys.exit(0)
    return command


def main() -> None:
    command = build_argv()
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
