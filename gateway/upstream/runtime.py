"""The gateway's live state: the policy in force and an `Upstream` per pool.

`Runtime.apply(policy)` swaps in a new policy. Pools whose spec did not change
are kept as they are (connections, health, counters); changed pools get new
upstreams, and the old ones close their connections once their last request
is done.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Mapping

from gateway.load import LoadReport
from gateway.policy.compiled import Policy
from gateway.state.fleet_load import Elsewhere, LocalCounts, nowhere
from gateway.upstream.admission import AdmissionGate
from gateway.upstream.pools import Endpoint, Pool
from gateway.upstream.upstream import Upstream


class Runtime:
    def __init__(self, policy: Policy, reported: LoadReport | None = None, *,
                 others: Callable[[], Elsewhere] = nowhere,
                 on_health_change: Callable[[Pool, Endpoint], None] = lambda pool, endpoint: None,
                 gate: AdmissionGate | None = None) -> None:
        self.policy = policy
        self.reported = reported or LoadReport()
        self.gate = gate or AdmissionGate()  # requests held while every candidate is past its objective
        self.upstreams: dict[str, Upstream] = {}
        self.pools: dict[str, Pool] = {}  # the upstreams' pools, by name
        self.others = others  # the other replicas' counts (shared state)
        self.on_health_change = on_health_change  # handed to every pool
        self._retiring: dict[asyncio.Task[None], Upstream] = {}
        self.apply(policy)

    def apply(self, policy: Policy) -> list[Pool]:
        """Install `policy`; returns the pools that are new."""
        old = self.upstreams
        upstreams: dict[str, Upstream] = {}
        created: list[Pool] = []
        for name, spec in policy.pools.items():
            kept = old.get(name)
            if kept is not None and kept.pool.spec == spec:
                upstreams[name] = kept
                continue
            upstreams[name] = Upstream(Pool(name, spec, elsewhere=functools.partial(self._endpoints_elsewhere, name),
                                            on_health_change=self.on_health_change, on_release=self.gate.released))
            created.append(upstreams[name].pool)
        self.policy, self.upstreams = policy, upstreams
        self.pools = {name: upstream.pool for name, upstream in upstreams.items()}
        for upstream in old.values():
            if upstreams.get(upstream.name) is not upstream:
                self._retire(upstream)
        return created

    def chain(self, names: Iterable[str]) -> list[Upstream]:
        return [self.upstreams[name] for name in names]

    def counts(self) -> LocalCounts:
        """What this gateway publishes to the fleet: per pool in flight + waiting,
        per endpoint in flight."""
        pools = self.pools
        return LocalCounts({name: pool.in_flight + pool.queue.waiting for name, pool in pools.items()},
                           {(name, e.url): e.outstanding for name, pool in pools.items() for e in pool.endpoints})

    def _endpoints_elsewhere(self, pool: str) -> Mapping[str, int]:
        return self.others().endpoint_counts(pool)

    async def aclose(self) -> None:
        retiring = list(self._retiring.values())
        for task in list(self._retiring):
            task.cancel()
        self._retiring.clear()
        for upstream in [*retiring, *self.upstreams.values()]:
            await upstream.aclose()

    def _retire(self, upstream: Upstream) -> None:
        try:
            task = asyncio.get_running_loop().create_task(self._close_when_idle(upstream))
        except RuntimeError:  # no loop yet (start-up): nothing can be in flight, nothing was opened
            return
        self._retiring[task] = upstream
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    @staticmethod
    async def _close_when_idle(upstream: Upstream) -> None:
        deadline = upstream.pool.spec.timeouts.total_s
        waited = 0.0
        while (upstream.pool.in_flight or upstream.pool.queue.busy()) and waited < deadline:
            await asyncio.sleep(0.5)
            waited += 0.5
        await upstream.aclose()
