"""Replay a trace against one way of serving, and what came of it.

Requests are sent open-loop at their arrival times; control events are posted
to every simulator of the way at theirs. Reported: goodput (requests per second
whose E2E per output token met the SLO, the same measure for streamed and
unstreamed requests), mean and p95 E2E, the 503s, the pools that answered, and
on a trace with a collapse, how long the collapsed domain's requests kept
going to the speculative pool.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from bench.routing.traces import Control, Request, Trace
from specgate.ops.measure import Sample, percentile, timed_request

STAYED_OUT = 10  # collapsed-domain requests in a row sent elsewhere: the domain has left the pool
BIN_S = 10.0  # the collapsed domain's share sent to the speculative pool, per this many seconds of arrivals


async def replay(url: str, trace: Trace, sims: list[str], model: str, way: str) -> tuple[list[Sample], float]:
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=600, limits=limits, trust_env=False) as client:
        started = time.perf_counter()

        async def wait_for(at: float) -> None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))

        async def fire(request: Request) -> Sample:
            await wait_for(request.at)
            return await timed_request(client, url, request.prompt, model=model, max_tokens=256, target=way,
                                       concurrency=0, stream=request.stream)

        async def control(event: Control) -> None:
            await wait_for(event.at)
            for sim in sims:
                (await client.post(f"{sim}/control", json=event.body)).raise_for_status()

        controls = [asyncio.create_task(control(event)) for event in trace.controls]
        samples = await asyncio.gather(*(fire(request) for request in trace.requests))
        await asyncio.gather(*controls)
        return list(samples), time.perf_counter() - started


def report(way: str, trace: Trace, samples: list[Sample], wall_s: float, slo_s: float,
           tight_slo_s: float, drafting: frozenset[str]) -> dict[str, Any]:
    ok = [s for s in samples if s.ok and s.output_tokens]
    e2e = [s.e2e_s for s in ok]
    good = [s for s in ok if s.e2e_s / s.output_tokens <= slo_s]
    tight = [s for s in ok if s.e2e_s / s.output_tokens <= tight_slo_s]
    pools: dict[str, int] = {}
    for sample in ok:
        pools[sample.pool or way] = pools.get(sample.pool or way, 0) + 1
    result = {"way": way, "requests": len(samples), "errors": len(samples) - len(ok),
              "http_503": sum(1 for s in samples if s.error == "http_503"),
              "e2e_mean_s": statistics.fmean(e2e) if e2e else None, "e2e_p95_s": percentile(e2e, 95),
              "goodput_rps": len(good) / wall_s, "met_slo": len(good), "wall_s": wall_s, "pools": pools,
              "goodput_tight_rps": len(tight) / wall_s, "met_tight_slo": len(tight)}
    if trace.controls and way == "gateway":
        result["collapse"] = collapse_exit(trace, samples, drafting)
    return result


def collapse_exit(trace: Trace, samples: list[Sample], drafting: frozenset[str]) -> dict[str, Any]:
    """After the first control event: when the collapsed domain's requests stopped
    going to the `drafting` pools (the first of STAYED_OUT in a row, by arrival,
    answered elsewhere), how many still went there after that, and in all."""
    event = trace.controls[0]
    domains = set(event.body.get("domain_quality", {}))
    after = [(r.at, s.pool) for r, s in zip(trace.requests, samples, strict=True)
             if r.at >= event.at and r.prompt.domain in domains and s.ok]
    out_at = None
    for i in range(len(after) - STAYED_OUT + 1):
        if all(pool not in drafting for _, pool in after[i:i + STAYED_OUT]):
            out_at = after[i][0]
            break
    late = [at for at, pool in after if pool in drafting and out_at is not None and at > out_at]
    share: dict[int, list[int]] = {}  # bin start -> [to speculative, all]
    for request, sample in zip(trace.requests, samples, strict=True):
        if request.prompt.domain in domains and sample.ok:
            counts = share.setdefault(int((request.at - event.at) // BIN_S * BIN_S), [0, 0])
            counts[0] += sample.pool in drafting
            counts[1] += 1
    return {"speculative_share_by_bin": {f"{start:+d}s": f"{n}/{total}" for start, (n, total) in sorted(share.items())},
            "collapse_at_s": event.at, "domains": sorted(domains), "requests_after": len(after),
            "to_speculative_after": sum(1 for _, pool in after if pool in drafting),
            "out_after_s": None if out_at is None else out_at - event.at,
            "to_speculative_once_out": len(late)}


def requests(trace: Trace, samples: list[Sample]) -> list[dict[str, Any]]:
    """Each request's arrival, class and outcome, for a reader who wants another cut of the run."""
    return [{"at": round(r.at, 3), "domain": r.prompt.domain, "temperature": r.prompt.temperature,
             "max_tokens": r.prompt.max_tokens, "stream": r.stream, "pool": s.pool, "ok": s.ok, "error": s.error,
             "e2e_s": round(s.e2e_s, 4), "output_tokens": s.output_tokens} for r, s in zip(trace.requests, samples,
                                                                                        strict=True)]


def decisions(gateway: str) -> dict[str, dict[str, int]]:
    """From the gateway's own counters, read before the stack stops: how many of its decisions
    explored, by the pool they went to (`specgate_route_decisions_total`), and how many requests
    it held, by how the hold ended (`specgate_admission_holds_total`)."""
    from prometheus_client.parser import text_string_to_metric_families

    explored: dict[str, int] = {}
    held: dict[str, int] = {}
    text = httpx.get(f"{gateway}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "specgate_route_decisions_total" and sample.labels.get("explored") == "true":
                pool = sample.labels["pool"]
                explored[pool] = explored.get(pool, 0) + int(sample.value)
            elif sample.name == "specgate_admission_holds_total":
                held[sample.labels["outcome"]] = int(sample.value)
    return {"explored": explored, "held": held}


def row(trace: str, result: dict[str, Any]) -> str:
    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    pools = ", ".join(f"{name} {count}" for name, count in sorted(result["pools"].items()))
    return (f"| {trace} | {result['way']} | {result['requests']} | {num(result['goodput_rps'])} | "
            f"{result['met_slo']} | {num(result['goodput_tight_rps'])} | {num(result['e2e_mean_s'])} | "
            f"{num(result['e2e_p95_s'])} | "
            f"{result['http_503']} | {result['errors']} | {pools} |")


HEADER = ("| trace | way | requests | goodput req/s | met SLO | goodput, tight SLO | mean E2E s | p95 E2E s "
          "| 503 | errors | pools |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
