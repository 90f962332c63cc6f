"""Recommend a fleet: how many speculative, standard and dynamic replicas to run on N GPUs.

    specgate plan WORKLOAD --gpus 2 [--calibration 8b-a100] [--ttft-s 1 --tpot-s 0.05]
                  [--kinds speculative,standard,dynamic] [--json] [--plot plan.png]

WORKLOAD is a workload description (.yaml: arrival phases, a class mix of
domain, temperature and max_tokens, optional per-class acceptance and
objective), a routing-benchmark trace or a prompt capture (.jsonl); see
docs/routing.md, "specgate plan". Every way to fill the replicas with the
kinds asked for (dynamic replicas all on one of a few candidate schedules,
or staggered over two) is replayed through the GPU-scale simulator
(backends/sim, docs/sim.md) with the same arrivals, and scored by goodput:
requests per second that met both the time-to-first-token and the
time-per-output-token objective. The table lists every option, best first;
the first row is the recommendation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from backends.sim.model import CALIBRATIONS

# GPUs one replica of each calibration takes (docs/sim.md: 8B on one A100, 70B over four).
GPUS_PER_REPLICA = {"8b-a100": 1, "70b-4xa100-draft1b": 4}
DEFAULT_SLO = {"ttft_s": 1.0, "tpot_s": 0.05}
# Options grow with the square of the replicas: 64 make 30,625, minutes of replay on two cores.
MAX_REPLICAS = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    parser.add_argument("workload", type=Path, help="workload .yaml, trace .jsonl or capture .jsonl")
    parser.add_argument("--gpus", type=int, required=True,
                        help=f"GPUs to fill with replicas (at most {MAX_REPLICAS} replicas)")
    parser.add_argument("--calibration", choices=tuple(CALIBRATIONS), default="8b-a100",
                        help="the simulated target, draft and GPU (docs/sim.md; default: %(default)s)")
    parser.add_argument("--ttft-s", type=float, help="time-to-first-token objective, seconds "
                        f"(default: the workload's slo, else {DEFAULT_SLO['ttft_s']})")
    parser.add_argument("--tpot-s", type=float, help="time-per-output-token objective, seconds "
                        f"(default: the workload's slo, else {DEFAULT_SLO['tpot_s']})")
    parser.add_argument("--kinds", default="speculative,standard,dynamic",
                        help="the replica kinds to consider, comma-separated (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the acceptance draws (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print every option as JSON instead of a table")
    parser.add_argument("--plot", type=Path, metavar="PATH", help="also draw goodput and mean E2E per option (PNG)")
    parser.add_argument("--policy", type=Path, metavar="PATH", help="also write the recommended fleet as a policy: "
                        "a pool per kind and schedule, the objective as each pool's slo, the rest the default's")


def run(args: argparse.Namespace) -> int:
    from specgate.plan.options import KINDS, candidate_schedules, options, ranked, score
    from specgate.plan.workload import load

    asked = {kind.strip() for kind in args.kinds.split(",") if kind.strip()}
    if not asked or asked - set(KINDS):
        raise ValueError(f"--kinds takes {', '.join(KINDS)}; got {args.kinds!r}")
    kinds = tuple(kind for kind in KINDS if kind in asked)
    per_replica = GPUS_PER_REPLICA[args.calibration]
    if args.gpus < per_replica:
        raise ValueError(f"--gpus {args.gpus}: one {args.calibration} replica takes {per_replica} GPUs")
    if args.gpus // per_replica > MAX_REPLICAS:
        raise ValueError(f"--gpus {args.gpus} makes {args.gpus // per_replica} {args.calibration} replicas; "
                         f"the plan weighs at most {MAX_REPLICAS}: plan a part of the fleet")
    workload = load(args.workload)
    slo = {**DEFAULT_SLO, **workload.slo}
    for key in slo:
        given = getattr(args, key)
        if given is not None:
            if given <= 0:
                raise ValueError(f"--{key.replace('_', '-')} must be positive")
            slo[key] = given
    params = CALIBRATIONS[args.calibration]
    considered = list(options(args.gpus // per_replica, kinds, candidate_schedules(params)))
    scores = ranked([score(option, workload, params, slo, args.seed) for option in _progress(considered)])
    summary = {"workload": workload.name, "requests": len(workload.requests), "duration_s": workload.duration_s,
               "gpus": args.gpus, "replicas": args.gpus // per_replica, "calibration": args.calibration,
               "slo": slo, "recommended": scores[0].as_dict(), "options": [s.as_dict() for s in scores]}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_table(summary))
    if args.plot:
        _plot(summary, args.plot)
    if args.policy:
        _write_policy(scores[0], slo, summary, args.policy)
    return 0


def _write_policy(best: Any, slo: dict[str, float], summary: dict[str, Any], path: Path) -> None:
    from gateway.settings import default_policy_path
    from specgate.plan.policy import policy_text

    line = (f"{summary['workload']} on {summary['gpus']} GPUs ({summary['calibration']}): "
            f"{best.goodput:.2f} requests/s met TTFT <= {slo['ttft_s']} s and TPOT <= {slo['tpot_s']} s.")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(policy_text(best.option, slo, default_policy_path(), line), encoding="utf-8")
    print(f"policy: {path}", file=sys.stderr)


def _progress(items: list[Any]) -> Any:
    from tqdm import tqdm

    return tqdm(items, desc="options", unit="option", file=sys.stderr, disable=None)


def _table(summary: dict[str, Any]) -> str:
    slo = summary["slo"]
    lines = [f"{summary['workload']}: {summary['requests']} requests over {summary['duration_s']:.0f} s, "
             f"{summary['replicas']} replicas on {summary['gpus']} GPUs ({summary['calibration']}), "
             f"objective TTFT <= {slo['ttft_s']} s and TPOT <= {slo['tpot_s']} s", ""]
    width = max(len(row["option"]) for row in summary["options"])
    lines.append(f"  {'option':<{width}}  goodput/s  SLO met  mean E2E s  mean TTFT s  p90 TPOT ms")
    for rank, row in enumerate(summary["options"]):
        mark = "*" if rank == 0 else " "
        lines.append(f"{mark} {row['option']:<{width}}  {row['goodput_rps']:>9.2f}  {row['slo_met']:>7.1%}  "
                     f"{row['mean_e2e_s']:>10.2f}  {row['mean_ttft_s']:>11.3f}  {row['p90_tpot_s'] * 1000:>11.1f}")
    lines += ["", f"recommended: {summary['recommended']['option']}"]
    return "\n".join(lines)


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["options"]
    labels = [row["option"] for row in rows]
    fig, goodput_axis = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 2), 5.5))
    colors = ["tab:green" if rank == 0 else "tab:blue" for rank in range(len(rows))]
    goodput_axis.bar(range(len(rows)), [row["goodput_rps"] for row in rows], color=colors)
    goodput_axis.set_ylabel("goodput (requests/s meeting the objective)")
    goodput_axis.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    e2e_axis = goodput_axis.twinx()
    e2e_axis.plot(range(len(rows)), [row["mean_e2e_s"] for row in rows], "o", color="tab:red")
    e2e_axis.set_ylabel("mean E2E (s)", color="tab:red")
    goodput_axis.set_title(f"{summary['workload']}: {summary['replicas']} replicas, best first")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
