"""Start vLLM's OpenAI server from a launch profile (used by compose and Kubernetes).

    python -m backends.vllm.launch --profile speculative-ngram --port 8000 [-- extra vLLM args]

Environment overrides: SPECGATE_VLLM_MODEL (model), SPECGATE_VLLM_SPEC_CONFIG
(JSON merged into the speculative config), SPECGATE_VLLM_EXTRA_ARGS (appended flags).

Traces: the OpenTelemetry variables that switch the gateway's traces on
(OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, unless
OTEL_SDK_DISABLED=true) give vLLM `--otlp-traces-endpoint` too, over
HTTP/protobuf unless OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL says otherwise, so
vLLM's spans join the gateway's trace (docs/tracing.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

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
    traces = otlp_traces_url(env)
    extra = ([] if traces is None else ["--otlp-traces-endpoint", traces])
    extra += [a for a in args.extra if a != "--"] + split_args(env.get("SPECGATE_VLLM_EXTRA_ARGS"))
    command = render(profiles[args.profile], model=args.model, host=args.host, port=args.port,
                     served_model_name=args.served_model_name, spec_config=spec_override, extra_args=extra)
    if args.dry_run:
        print(shlex.join(command))
        sys.exit(0)
    return command


def otlp_traces_url(env: Mapping[str, str]) -> str | None:
    """Where vLLM sends its spans, by OpenTelemetry's variables; None: tracing is off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + "/v1/traces" if base else None


def vllm_environ(env: Mapping[str, str]) -> dict[str, str]:
    """vLLM's environment: its traces go over HTTP/protobuf, as the gateway's, unless a protocol is set
    (vLLM's own default is gRPC)."""
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return {**env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol or "http/protobuf"}


def main() -> None:
    command = build_argv()
    os.execve(command[0], command, vllm_environ(os.environ))


if __name__ == "__main__":
    main()
