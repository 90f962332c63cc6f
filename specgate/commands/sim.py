"""Run a simulated vLLM pool: OpenAI API, vLLM metrics, GPU-scale timing.

The server answers `/v1/chat/completions`, `/v1/completions`, `/v1/models`,
`/health` and `/metrics` like vLLM. Its step times follow a model of an
8B model on an A100 (docs/sim.md): a speculative pool is faster at low
concurrency and slower at high concurrency, and its draft acceptance falls
with temperature and varies by domain (code, math, chat). A dynamic pool
speculates only while its batch is small, as engines that turn speculation
off under load do.
"""

from __future__ import annotations

import argparse

from backends.sim.model import CALIBRATIONS, SimParams
from backends.speculation import SpeculationSchedule

# The SimParams fields the command line can change, each a positive number: (type, help).
TUNABLE: dict[str, tuple[type[int] | type[float], str]] = {
    "num_speculative_tokens": (int, "draft tokens per step"),
    "max_num_seqs": (int, "sequences per batch; more requests wait"),
    "output_tokens": (int, "answer length when max_tokens does not cut it shorter"),
    "draft_quality": (
        float,
        "multiply every draft acceptance; e.g. 0.6 models a weak draft whose acceptance trips the guard",
    ),
    "speculative_max_batch": (
        int,
        "--kind dynamic: draft while at most this many sequences decode, decode plainly above",
    ),
    "prefix_cache_tokens": (int, "KV cache tokens the prefix cache keeps, least recently used evicted"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kind",
        choices=("speculative", "standard", "dynamic"),
        required=True,
        help="speculative decoding (EAGLE-style drafts, exports spec-decode counters), "
        "standard decoding (one token per step), or dynamic: speculative while the batch "
        "is at most --speculative-max-batch sequences, standard above",
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
        "--calibration",
        choices=tuple(CALIBRATIONS),
        default="8b-a100",
        help="the modelled target, draft and GPU, every constant of docs/sim.md (default: %(default)s)",
    )
    for name, (kind, help_text) in TUNABLE.items():
        flag, default = "--" + name.replace("_", "-"), getattr(CALIBRATIONS["8b-a100"], name)
        parser.add_argument(flag, type=kind, help=f"{help_text} (default: the calibration's; {default} for 8b-a100)")
    parser.add_argument(
        "--speculation-schedule", metavar="JSON",
        help='--kind dynamic: draft tokens by batch size, vLLM\'s format, e.g. "[[1, 8, 3], [9, 32, 2], [33, 256, 0]]" '
        "(default: a switch at --speculative-max-batch)",
    )
    parser.add_argument(
        "--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
        help="cache prompt prefixes as vLLM's automatic prefix caching does (default: on)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=None, help="seed for acceptance draws")
    parser.add_argument(
        "--log-level", default="warning", help="uvicorn log level (default: %(default)s)"
    )


def params_from(args: argparse.Namespace) -> SimParams:
    """The calibration's constants with the options given on the command line over them."""
    import dataclasses

    for name in ("time_scale", *TUNABLE):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise SystemExit(f"specgate sim: --{name.replace('_', '-')} must be positive")
    given: dict[str, object] = {name: getattr(args, name) for name in TUNABLE if getattr(args, name) is not None}
    if args.speculation_schedule:
        given["speculation_schedule"] = _schedule(args.speculation_schedule)
    return dataclasses.replace(CALIBRATIONS[args.calibration], **given)


def _schedule(text: str) -> SpeculationSchedule:
    try:
        return SpeculationSchedule.from_json(text)
    except ValueError as exc:
        raise SystemExit(f"specgate sim: --speculation-schedule: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from backends.serving.server import bind_socket, uvicorn_config
    from backends.sim.server import create_sim_app

    app, _ = create_sim_app(
        args.kind, args.model, params=params_from(args), time_scale=args.time_scale, seed=args.seed,
        prefix_cache=args.prefix_cache,
    )  # fmt: skip
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        raise SystemExit(f"specgate sim: cannot listen on {args.host}:{args.port}: {exc}") from exc
    print(f"specgate sim ({args.kind}) serving {args.model} on http://{args.host}:{args.port}",
          flush=True)  # fmt: skip
    uvicorn.Server(uvicorn_config(app, args.host, args.port, args.log_level)).run(sockets=[sock])
    return 0
