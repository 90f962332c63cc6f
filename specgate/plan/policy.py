"""The recommended fleet as a policy file, ready to point at its replicas.

One pool per kind, and per schedule for dynamic replicas (a staggered fleet
is two dynamic pools), each with one endpoint per replica at a placeholder
URL, the objective the plan scored by as its `slo`, and everything else
(defaults, domains, routing, rules, guard) from the default policy. A
drafting pool falls back to the standard pool where the fleet has one, else
to the next drafting pool, as policies/examples/staggered-dynamic.yaml does.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

from specgate.plan.options import Option


def pools_of(option: Option, slo: dict[str, float]) -> dict[str, dict[str, Any]]:
    """The option's replicas as pools, drafting ones first."""
    groups: list[tuple[str, dict[str, Any], int]] = []
    if option.speculative:
        groups.append(("speculative", {"kind": "speculative"}, option.speculative))
    runs = [(schedule, len(list(group))) for schedule, group in itertools.groupby(option.schedules)]
    for index, (schedule, count) in enumerate(runs):
        name = "dynamic" if len(runs) == 1 else f"dynamic-{chr(ord('a') + index)}"
        groups.append((name, {"kind": "dynamic", "speculation_schedule": schedule.as_list()}, count))
    if option.standard:
        groups.append(("standard", {"kind": "standard"}, option.standard))
    names = [name for name, _, _ in groups]
    pools = {}
    for position, (name, kind, count) in enumerate(groups):
        pool: dict[str, Any] = {**kind, "endpoints": [{"url": f"http://{name}-{i}.internal:8000"}
                                                      for i in range(1, count + 1)]}
        if name != "standard":
            fallback = "standard" if "standard" in names else names[position + 1] if position + 1 < len(names) \
                else None
            if fallback:
                pool["fallback"] = fallback
        pool["slo"] = dict(slo)
        pools[name] = pool
    return pools


def policy_text(option: Option, slo: dict[str, float], default_policy: Path, summary: str) -> str:
    """The policy file: the default's sections around the option's pools."""
    data = yaml.safe_load(default_policy.read_text(encoding="utf-8"))
    pools = pools_of(option, slo)
    data["pools"] = pools
    data["default_pool"] = "standard" if "standard" in pools else next(iter(pools))
    header = (f"# The fleet `specgate plan` recommends: {option.label()}.\n# {summary}\n"
              "# Point each endpoint at its replica, and set max_in_flight to each engine's --max-num-seqs;\n"
              "# `specgate up --policy` runs it on one machine, one local backend per pool.\n")
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
