"""The load a routing decision reads, per pool, so that a burst does not herd.

A decision counts in its pool's load from the moment it is made: the edge
goes from the decision to the lease without an await (Relay -> Exchange.open
-> Forwarder -> Claim.take), so the pool's in-flight count has moved before
the next request is decided. Two things would still hide it:

- the backends' reported load (running + waiting, published by the guard
  every check) is older than the burst; `max(in-flight, reported)` would not
  move while the gateway's own count is under the report. The requests leased
  since the report are added to it instead (and those finished since taken off).
- a request waiting in a full pool's queue holds no lease yet: the pool's
  waiters are added.

With shared state the gateway's own count is the fleet's: this replica's
live in-flight count plus the other replicas' as last published (refreshed
in the background every 100 ms, see gateway/state/fleet_load.py), so a burst
through another replica moves this one's decisions too.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.upstream.runtime import Runtime


class DecisionLoad:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._report: Mapping[str, int] | None = None  # the report the baseline was taken at
        self._at_report: dict[str, int] = {}  # each pool's in-flight count when the report was first read

    def __call__(self) -> dict[str, int]:
        reported = self.runtime.reported.snapshot()
        others = self.runtime.others()
        pools = self.runtime.pools
        if reported is not self._report:  # a new report: what is in flight now is in it
            self._report = reported
            self._at_report = {name: pool.in_flight + others.pool(name) for name, pool in pools.items()}
        load = {}
        for name, pool in pools.items():
            fleet = pool.in_flight + others.pool(name)
            since = fleet - self._at_report.get(name, fleet)
            load[name] = max(fleet, reported.get(name, 0) + since) + pool.queue.waiting
        return load
