"""Predicted against measured time per output token, per traffic class, through a running gateway.

Two simulated replicas (one speculative, one standard) behind a gateway on
`policies/default.yaml`, as the routing benchmark's gateway way. Each round
asks every class (domain x temperature) on each pool in turn, one request at a
time: first `POST /admin/explain` for the model's predicted TPOT on that pool
(the mean, nothing sent), then the request itself, streamed and pinned to the
pool with `x-specgate-route`, for the TPOT it really had. Round 1 is what the
priors predict; later rounds what the model learned. Writes the points as
JSON and a plot of predicted against measured, cold and learned side by side.

    python bench/routing/tpot_fit.py --rounds 6 --out bench/out/tpot-fit
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.routing import stack  # noqa: E402 - importable once the root is on sys.path
from specgate.ops.measure import timed_request  # noqa: E402 - as above
from specgate.ops.prompts import user  # noqa: E402 - as above

TOKEN = "tpot-fit"
PROMPTS = {
    "code": "Write a Python function that merges two sorted lists.\n```python\ndef merge(a, b):\n```",
    "math": "Prove that the sum of two even numbers is even.",
    "chat": "Tell me about the history of tea.",
}
TEMPERATURES = (0.0, 0.3, 0.8, 1.5)  # one of each band: greedy, low, mid, hot


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="requests per class and pool")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--calibration", default="8b-a100", help="the simulators' (docs/sim.md)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "tpot-fit")
    return parser.parse_args()


async def measure(url: str, rounds: int, max_tokens: int) -> list[dict[str, Any]]:
    points = []
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        for round_number in range(1, rounds + 1):
            for domain, text in PROMPTS.items():
                for temperature in TEMPERATURES:
                    prompt = user(text, max_tokens=max_tokens, temperature=temperature, domain=domain)
                    body = prompt.body(stack.MODEL, max_tokens, True)
                    for pool in ("speculative", "standard"):
                        explained = (await client.post(f"{url}/admin/explain", json=body, headers=headers)).json()
                        predicted = {c["pool"]: c["tpot_s"] for c in explained["fastest"]["candidates"]}[pool]
                        client.headers["x-specgate-route"] = pool
                        sample = await timed_request(client, url, prompt, model=stack.MODEL, max_tokens=max_tokens,
                                                     target=pool, concurrency=1)
                        del client.headers["x-specgate-route"]
                        points.append({"round": round_number, "class": explained["fastest"]["traffic_class"],
                                       "pool": pool, "predicted_tpot_s": predicted, "measured_tpot_s": sample.tpot_s})
    return points


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 5), sharex=True, sharey=True)
    bands = {"greedy": "tab:blue", "low": "tab:green", "mid": "tab:orange", "hot": "tab:red"}
    for axis, (title, keep) in zip(axes, (("cold: the priors (round 1)", lambda r: r == 1),
                                         ("learned (rounds 3 and on)", lambda r: r >= 3)), strict=True):
        for point in points:
            if point["measured_tpot_s"] is None or not keep(point["round"]):
                continue
            band = point["class"].split("/")[1]
            axis.scatter(point["measured_tpot_s"] * 1000, point["predicted_tpot_s"] * 1000, s=22,
                         color=bands[band], marker="o" if point["pool"] == "speculative" else "s", alpha=0.8)
        top = max(max(p["predicted_tpot_s"], p["measured_tpot_s"] or 0) for p in points) * 1000 * 1.05
        axis.plot([0, top], [0, top], color="grey", linewidth=0.8)
        axis.set_title(title)
        axis.set_xlabel("measured TPOT, ms")
    axes[0].set_ylabel("predicted TPOT, ms")
    handles = [plt.Line2D([], [], color=c, marker="o", linestyle="", label=b) for b, c in bands.items()]
    handles += [plt.Line2D([], [], color="black", marker=m, linestyle="", label=p)
                for p, m in (("speculative pool", "o"), ("standard pool", "s"))]
    axes[1].legend(handles=handles, loc="upper left", fontsize=8)
    figure.suptitle("Time per output token per class: the latency model against the simulated replicas")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    args = arguments()
    args.out.mkdir(parents=True, exist_ok=True)
    policy = stack.default_policy()
    policy["overrides"] = {"route_header": True}
    policy["guard"] = {"enabled": False}  # every request goes where it is pinned
    work = Path(tempfile.mkdtemp(prefix="specgate-tpot-fit-"))
    path = work / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    os.environ["SPECGATE_ADMIN_TOKEN"] = TOKEN
    running = stack.start("gateway", work, 1.0, ["--calibration", args.calibration], policy)
    try:
        points = asyncio.run(measure(running.url, args.rounds, args.max_tokens))
    finally:
        running.stop()
    (args.out / "points.json").write_text(json.dumps(points, indent=1))
    plot(points, args.out / "tpot-fit.png")
    for label, keep in (("cold", 1), ("learned", 3)):
        chosen = [p for p in points if p["measured_tpot_s"] and (p["round"] == 1 if keep == 1 else p["round"] >= 3)]
        errors = sorted(abs(p["predicted_tpot_s"] / p["measured_tpot_s"] - 1) for p in chosen)
        print(f"{label}: {len(errors)} points, median |predicted/measured - 1| = {errors[len(errors) // 2]:.3f}, "
              f"90th = {errors[int(len(errors) * 0.9)]:.3f}")


if __name__ == "__main__":
    main()
