"""bench/overhead.py's run in numbers: each target's medians over rounds, against direct and
nginx (and the baseline, where there is one), the Markdown tables docs/benchmarks.md quotes, and
each round's CPU a request beside the baseline's: the spread a median hides."""

from __future__ import annotations

import statistics


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    keys = sorted({(r["mode"], r["concurrency"]) for r in runs})
    for mode, concurrency in keys:
        med = {}
        for target in sorted({r["target"] for r in runs}):
            sample = [r for r in runs if (r["mode"], r["concurrency"], r["target"]) == (mode, concurrency, target)]
            med[target] = {k: statistics.median(r[k] for r in sample) for k in ("rps", "p50_ms", "p99_ms", "cpu_us")}
            med[target]["errors"] = sum(r["errors"] for r in sample)
        row = {
            "mode": mode, "concurrency": concurrency, **med,
            "gateway_added_p50_ms": med["gateway"]["p50_ms"] - med["direct"]["p50_ms"],
            "gateway_added_p99_ms": med["gateway"]["p99_ms"] - med["direct"]["p99_ms"],
            "gateway_vs_direct_rps": med["gateway"]["rps"] / med["direct"]["rps"],
            "gateway_vs_nginx_rps": med["gateway"]["rps"] / med["nginx"]["rps"],
        }
        if "baseline" in med:
            row["gateway_vs_baseline_rps"] = med["gateway"]["rps"] / med["baseline"]["rps"]
        row["extra"] = [target for target in med if target not in ("direct", "nginx", "gateway", "baseline")]
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| mode | conc. | direct rps | nginx rps | gateway rps | gw/direct | gw/nginx | "
             "direct p50/p99 ms | nginx p50/p99 ms | gateway p50/p99 ms | added p50/p99 ms | CPU us/req d/n/g | "
             "errors d/n/g |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d, n, g = r["direct"], r["nginx"], r["gateway"]
        lines.append(
            f"| {r['mode']} | {r['concurrency']} | {d['rps']:.0f} | {n['rps']:.0f} | {g['rps']:.0f} | "
            f"{r['gateway_vs_direct_rps']:.2f} | {r['gateway_vs_nginx_rps']:.2f} | "
            f"{d['p50_ms']:.2f}/{d['p99_ms']:.2f} | {n['p50_ms']:.2f}/{n['p99_ms']:.2f} | "
            f"{g['p50_ms']:.2f}/{g['p99_ms']:.2f} | {r['gateway_added_p50_ms']:.2f}/{r['gateway_added_p99_ms']:.2f} | "
            f"{d['cpu_us']:.0f}/{n['cpu_us']:.0f}/{g['cpu_us']:.0f} | {d['errors']}/{n['errors']}/{g['errors']} |")
    if rows and "baseline" in rows[0]:
        lines += ["", "| mode | conc. | baseline rps | gateway rps | gw/baseline | baseline p50/p99 ms | "
                      "gateway p50/p99 ms | CPU us/req b/g | errors b/g |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            b, g = r["baseline"], r["gateway"]
            lines.append(f"| {r['mode']} | {r['concurrency']} | {b['rps']:.0f} | {g['rps']:.0f} | "
                         f"{r['gateway_vs_baseline_rps']:.2f} | {b['p50_ms']:.2f}/{b['p99_ms']:.2f} | "
                         f"{g['p50_ms']:.2f}/{g['p99_ms']:.2f} | {b['cpu_us']:.0f}/{g['cpu_us']:.0f} | "
                         f"{b['errors']}/{g['errors']} |")
    if rows and rows[0]["extra"]:
        lines += ["", "| mode | conc. | target | rps | vs gateway | vs nginx | p50/p99 ms | "
                      "p50 - gateway p50 ms | CPU us/req | errors |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            g, n = r["gateway"], r["nginx"]
            for target in ["gateway", *r["extra"]]:
                t = r[target]
                lines.append(f"| {r['mode']} | {r['concurrency']} | {target} | {t['rps']:.0f} | "
                             f"{t['rps'] / g['rps']:.2f} | {t['rps'] / n['rps']:.2f} | "
                             f"{t['p50_ms']:.2f}/{t['p99_ms']:.2f} | {t['p50_ms'] - g['p50_ms']:+.2f} | "
                             f"{t['cpu_us']:.0f} | {t['errors']} |")
    return "\n".join(lines)


def rounds_markdown(runs: list[dict], targets: tuple[str, ...] = ("baseline", "gateway")) -> str:
    """CPU µs a request in each round, by mode and concurrency, for each of `targets` that ran:
    whether a change shows outside the rounds' spread."""
    ran = [target for target in targets if any(r["target"] == target for r in runs)]
    lines = ["| CPU µs a request, each round | " + " | ".join(ran) + " |", "|---|" + "---|" * len(ran)]
    for mode, concurrency in sorted({(r["mode"], r["concurrency"]) for r in runs}):
        cells = []
        for target in ran:
            rounds = sorted((r["round"], r["cpu_us"]) for r in runs
                            if (r["mode"], r["concurrency"], r["target"]) == (mode, concurrency, target))
            cells.append(", ".join(f"{cpu:.0f}" for _, cpu in rounds))
        lines.append(f"| {mode}, {concurrency} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
