"""Run a simulated vLLM pool: OpenAI API, vLLM metrics, GPU-scale timing.

The server answers `/v1/chat/completions`, `/v1/completions`, `/v1/models`,
`/health` and `/metrics` like vLLM. Its step times follow a model of an
8B model on an A100 (docs/sim.md): a speculative pool is faster at low
concurrency and slower at high concurrency, and its draft acceptance falls
with temperature and varies by domain (code, math, chat).
"""

from __future__ import annotations

import argparse

from backends.sim.model import SimParams

DEFAULTS = SimParams()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kind",
        choices=("speculative", "standard"),
        required=True,
        help="speculative decoding (EAGLE-style drafts, exports spec-decode counters) "
        "or standard decoding (one token per step)",
    )
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--model", default="specgate-sim", help="served model name (default: %(default)s)"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply every simulated duration; 0.1 runs 10x faster than the modelled GPU "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=DEFAULTS.num_speculative_tokens,
        help="draft tokens per step (default: %(default)s)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=DEFAULTS.max_num_seqs,
        help="sequences per batch; more requests wait (default: %(default)s)",
    )
    parser.add_argument(
        "--output-tokens",
        type=int,
        default=DEFAULTS.output_tokens,
        help="answer length when max_tokens does not cut it shorter (default: %(default)s)",
    )
    parser.add_argument(
        "--draft-quality",
        type=float,
        default=DEFAULTS.draft_quality,
        help="multiply every draft acceptance; e.g. 0.6 models a weak draft whose "
        "acceptance trips the guard (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for acceptance draws")
    parser.add_argument(
        "--log-level", default="warning", help="uvicorn log level (default: %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import uvicorn

    from backends.serving.server import bind_socket, uvicorn_config
    from backends.sim.server import create_sim_app

    names = ("time_scale", "num_speculative_tokens", "max_num_seqs", "output_tokens",
             "draft_quality")  # fmt: skip
    for name in names:
        if getattr(args, name) <= 0:
            raise SystemExit(f"specgate sim: --{name.replace('_', '-')} must be positive")
    params = dataclasses.replace(
        DEFAULTS,
        num_speculative_tokens=args.num_speculative_tokens,
        max_num_seqs=args.max_num_seqs,
        output_tokens=args.output_tokens,
        draft_quality=args.draft_quality,
    )
    app, _ = create_sim_app(
        args.kind, args.model, params=params, time_scale=args.time_scale, seed=args.seed
    )
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        raise SystemExit(f"specgate sim: cannot listen on {args.host}:{args.port}: {exc}") from exc
    print(f"specgate sim ({args.kind}) serving {args.model} on http://{args.host}:{args.port}",
          flush=True)  # fmt: skip
    uvicorn.Server(uvicorn_config(app, args.host, args.port, args.log_level)).run(sockets=[sock])
    return 0
