"""Backend pools at run time: endpoints, their health, and picking one.

Picking is the pool's balancer (balance.py): prefix and session affinity
with bounded load, or least-outstanding-requests with two random choices
drawn by weight; with shared state an endpoint's outstanding count adds the
other replicas' as last published (`Pool.elsewhere`). An endpoint leaves rotation
when `unhealthy_after` consecutive active health checks fail (one slow or lost
check does not take a serving endpoint out; the check after a failed one comes
within `CONFIRM_S`), or after `eject_after` consecutive request failures
(passive ejection, with exponential back-off). When an ejection's back-off
ends the endpoint is half-open: exactly one request may try it; success restores it, failure
ejects it again for twice as long, and a neutral release (the client left
before the answer began: nothing was learnt) lets the next request try. If
nothing in a pool is available the caller may ask for the least-bad
endpoint instead of failing everything: one the health check fails will do,
but never one between trials (its back-off runs, or its trial is out), so an
ejected endpoint sees one request per back-off whatever happens around it.

A pool whose endpoints are merely full (at their in-flight limit, healthy)
raises `AtCapacity`, not `NoHealthyBackend`: the request may wait in the
pool's `WaitQueue` (see queue.py) for a lease to come back. While anyone
waits, or a wake-up is on its way to a waiter, a newcomer does not take the
slot: it queues behind them.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import httpx
import structlog

from gateway.errors import AtCapacity, NoHealthyBackend
from gateway.policy.balance import balance_of
from gateway.policy.pools import PoolSpec, TimeoutsSpec
from gateway.upstream.balance import Balancer, Choice, LeastOutstanding, PrefixAffinity
from gateway.upstream.prompt_key import PromptKey
from gateway.upstream.queue import WaitQueue
from gateway.upstream.target import Target

UNLIMITED = 1 << 30  # the room of an endpoint without an in-flight limit
CONFIRM_S = 1.0  # after a failed health check, the next comes within this (at most the pool's interval)


@dataclass(eq=False)
class Endpoint:
    url: str
    weight: float
    max_in_flight: int | None
    outstanding: int = 0
    healthy: bool = True  # the active health checks: not `unhealthy_after` failed in a row
    check_failures: int = 0  # consecutive failed active health checks
    failures: int = 0  # consecutive request failures
    ejected_until: float = 0.0
    backoff_s: float = 0.0
    trial_in_flight: bool = False  # the one request allowed while half-open
    _targets: dict[str, Target] = field(default_factory=dict, repr=False)

    def target_for(self, path: str) -> Target:
        """Where `path` on this endpoint goes, its URL parsed. Parsing a URL is a visible
        share of a proxied request's cost, and the hot paths repeat: cache a few."""
        target = self._targets.get(path)
        if target is None:
            target = Target(httpx.URL(self.url + path))
            if len(self._targets) < 16 and "?" not in path:
                self._targets[path] = target
        return target

    def ejected(self) -> bool:
        return self.ejected_until > 0.0

    def full(self) -> bool:
        return self.max_in_flight is not None and self.outstanding >= self.max_in_flight

    def available(self, now: float) -> bool:
        return self.usable(now) and not self.full()

    def usable(self, now: float) -> bool:
        """Would take a request if it had room: healthy, and not ejected (or
        its back-off is over and no half-open trial is out)."""
        return self.healthy and not self.resting(now)

    def resting(self, now: float) -> bool:
        """Ejected and between trials: its back-off runs, or its one trial is out."""
        return self.ejected() and (now < self.ejected_until or self.trial_in_flight)

    def room(self, now: float) -> int:
        """How many more requests it takes now: one while half-open."""
        if not self.available(now):
            return 0
        if self.ejected():
            return 1
        return UNLIMITED if self.max_in_flight is None else self.max_in_flight - self.outstanding


class Lease:
    """One request's hold on an endpoint: release it exactly once. `ok` is what
    the request says of the endpoint: True worked, False failed, None nothing.
    A plain class, built per request: mypyc compiles the `__init__` written out."""

    def __init__(self, pool: Pool, endpoint: Endpoint, trial: bool, why: str = "least_bad", matched: int = 0,
                 load_area: float = 0.0, taken_at: float = 0.0) -> None:
        self.pool = pool
        self.endpoint = endpoint
        self.trial = trial
        self.released = False
        self.why = why  # the balancer's reason for the endpoint (see Choice), or the degraded pick
        self.matched = matched  # leading prompt blocks the endpoint was last sent
        self.load_area = load_area  # the pool's requests x seconds when it was taken (Pool.load_area)
        self.taken_at = taken_at
        self.mean_load: float | None = None  # on release: the pool's mean in flight while it was held, itself included

    def release(self, ok: bool | None, why: str = "failed") -> None:
        """`why`: the endpoint's fault when `ok` is False (connect, status_502, idle, ...), for the log."""
        if self.released:
            return
        self.released = True
        self.pool.release(self, ok, why)


class Timeouts:
    """A pool's timeouts, read off its spec once: the request path reads them six times or more a
    request, and a compiled class's attribute is a field where a pydantic model's is a lookup."""

    def __init__(self, spec: TimeoutsSpec) -> None:
        self.connect_s = spec.connect_s
        self.first_byte_s = spec.first_byte_s
        self.total_s = spec.total_s
        self.idle_s = spec.idle_s


_NO_COUNTS: Mapping[str, int] = MappingProxyType({})


def _nowhere() -> Mapping[str, int]:
    return _NO_COUNTS


class Pool:
    def __init__(self, name: str, spec: PoolSpec, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, *, elsewhere: Callable[[], Mapping[str, int]] = _nowhere,
                 on_health_change: Callable[[Pool, Endpoint], None] = lambda pool, endpoint: None,
                 on_release: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.on_release = on_release  # a lease came back: the admission gate re-routes a held request
        self.spec = spec  # fixed for the pool's life: a reload that changes it builds a new pool
        self.timeouts = Timeouts(spec.timeouts)
        # What the request path reads of the spec on every request, read once (as `timeouts`)
        self.model = spec.model  # the name its backends serve, sent in place of the client's
        self.max_model_len = spec.max_model_len
        self.pacing_delay_s = spec.pacing.max_delay_ms / 1000 if spec.pacing.enabled else None  # None: not paced
        self._key_variable = spec.api_key_variable
        self.clock = clock
        self.rng = rng or random.Random()
        self.endpoints = [Endpoint(e.url, e.weight, e.max_in_flight or spec.max_in_flight)
                          for e in spec.endpoints]
        self.in_flight = 0  # requests this gateway has open on the pool
        self._area, self._area_at = 0.0, clock()  # in flight integrated over time, up to _area_at
        self.elsewhere = elsewhere  # url -> other replicas' in flight
        self.on_health_change = on_health_change  # an endpoint of this pool went up or down
        self.log = structlog.get_logger("specgate.pools")
        self.queue = WaitQueue(name, *queue_limits(spec), free=self.free)
        by_prefix = balance_of(spec.balance, len(spec.endpoints)) == "prefix"
        self.balancer: Balancer[Endpoint] = (
            PrefixAffinity(spec.affinity, self.rng) if by_prefix else LeastOutstanding(self.rng))

    def paces(self, body: Mapping[str, Any] | None, stream: bool) -> bool:
        """Whether this pool's answer to a request is paced (upstream/pacing.py): a stream of one
        choice, where the policy paces the pool."""
        return stream and self.pacing_delay_s is not None and body is not None and body.get("n", 1) in (1, None)

    def upstream_api_key(self) -> str | None:
        """The pool's own key for its backends, read from the environment on each request."""
        return None if self._key_variable is None else os.environ.get(self._key_variable)

    def has_available(self) -> bool:
        now = self.clock()
        return any(e.available(now) for e in self.endpoints)

    def free(self) -> int:
        """Requests the pool takes now, over all its endpoints."""
        now = self.clock()
        return sum(e.room(now) for e in self.endpoints)

    def acquire(self, exclude: Iterable[Endpoint] = (), degraded: bool = False, admitted: bool = False,
                key: PromptKey | None = None) -> Lease:
        """Lease an endpoint; `degraded` allows the least-bad one when none is
        available and none is merely full. `admitted`: the request may pass
        the pool's waiters (it holds a wake-up, or is retrying its own attempt).
        `key`: the request's prompt and session, for the balancer."""
        skip = set(exclude)
        now = self.clock()
        candidates = [e for e in self.endpoints if e not in skip and e.available(now)]
        choice: Choice[Endpoint] | None = None
        if candidates and (admitted or not self._queued_ahead()):
            choice = self.balancer.pick(candidates, key, self.elsewhere)
            endpoint = choice.endpoint
        elif any(e.usable(now) for e in self.endpoints if e not in skip):
            raise AtCapacity(f"pool '{self.name}' is at its in-flight limit")
        elif degraded:
            endpoint = self._least_bad([e for e in self.endpoints if e not in skip and not e.full()], now)
        else:
            left = [e for e in self.endpoints if e not in skip]
            ejected = bool(left) and all(e.healthy and e.resting(now) for e in left)
            raise NoHealthyBackend(f"pool '{self.name}' has no healthy endpoint",
                                   reason="ejected" if ejected else "unhealthy")
        trial = endpoint.ejected()
        if trial:
            endpoint.trial_in_flight = True
        endpoint.outstanding += 1
        self._count(now, 1)
        if choice is None:
            return Lease(self, endpoint, trial, load_area=self._area, taken_at=now)
        self.balancer.record(choice)
        return Lease(self, endpoint, trial, why=choice.reason, matched=choice.matched, load_area=self._area,
                     taken_at=now)

    def _count(self, now: float, delta: int) -> None:
        """`in_flight` moves by `delta` at `now`; what it was until then goes into the area under
        it, so a lease's mean load is two subtractions (`release`)."""
        self._area += self.in_flight * max(0.0, now - self._area_at)
        self._area_at = max(now, self._area_at)
        self.in_flight += delta

    def explain(self, key: PromptKey | None) -> dict[str, object]:
        """The endpoint `acquire` would pick now for `key` and why, leasing nothing."""
        now = self.clock()
        candidates = [e for e in self.endpoints if e.available(now)]
        balance = "prefix" if isinstance(self.balancer, PrefixAffinity) else "least_outstanding"
        if not candidates:
            return {"balance": balance, "endpoint": None, "reason": "no endpoint available"}
        return {"balance": balance, **self.balancer.pick(candidates, key, self.elsewhere).to_json()}

    def _queued_ahead(self) -> bool:
        """Whether waiters (or wake-ups on their way) have every free slot."""
        if not self.queue.busy():
            return False
        self.queue.wake()  # slots may have come back without a release (a back-off ended)
        return self.free() <= self.queue.handed

    def _capacity_lost(self) -> None:
        """No endpoint would take a request any more, however long one waits
        for a slot: the waiters walk their chains again and fail fast."""
        now = self.clock()
        if self.queue.waiting and not any(e.usable(now) for e in self.endpoints):
            self.queue.flush()

    def release(self, lease: Lease, ok: bool | None, why: str = "failed") -> None:
        endpoint = lease.endpoint
        endpoint.outstanding -= 1
        now = self.clock()
        self._count(now, -1)
        if now > lease.taken_at:
            lease.mean_load = (self._area - lease.load_area) / (now - lease.taken_at)
        if lease.trial:
            endpoint.trial_in_flight = False
        if ok is True:
            self._succeeded(endpoint)
        elif ok is False:
            self._failed(endpoint, why)
        if self.queue.waiting:
            self.queue.wake()
        if self.on_release is not None:
            self.on_release(self.name)

    def set_health(self, endpoint: Endpoint, healthy: bool) -> None:
        if endpoint.healthy != healthy:
            endpoint.healthy = healthy
            self.log.warning("endpoint_healthy" if healthy else "endpoint_unhealthy", pool=self.name,
                             endpoint=endpoint.url, reason="health_check", failures=endpoint.failures)
            self.on_health_change(self, endpoint)
            if healthy and self.queue.waiting:
                self.queue.wake()
            elif not healthy:
                self._capacity_lost()

    def _succeeded(self, endpoint: Endpoint) -> None:
        was_ejected, failures = endpoint.ejected(), endpoint.failures
        endpoint.failures = 0
        endpoint.ejected_until = 0.0
        endpoint.backoff_s = 0.0
        if was_ejected:
            self.log.warning("endpoint_restored", pool=self.name, endpoint=endpoint.url,
                             reason="trial_succeeded", failures=failures)
            self.on_health_change(self, endpoint)

    def _failed(self, endpoint: Endpoint, why: str) -> None:
        endpoint.failures += 1
        health = self.spec.health
        if endpoint.ejected() or endpoint.failures >= health.eject_after:
            was_ejected = endpoint.ejected()
            endpoint.backoff_s = min(health.max_backoff_s,
                                     endpoint.backoff_s * 2 if endpoint.backoff_s else health.backoff_s)
            endpoint.ejected_until = self.clock() + endpoint.backoff_s
            self.log.warning("endpoint_ejected", pool=self.name, endpoint=endpoint.url, reason=why,
                             failures=endpoint.failures, backoff_s=endpoint.backoff_s,
                             trial=was_ejected)
            if not was_ejected:
                self.on_health_change(self, endpoint)
                self._capacity_lost()

    def _least_bad(self, endpoints: list[Endpoint], now: float) -> Endpoint:
        """The best of `endpoints` not between trials; when every one is, the
        answer says when the first back-off ends."""
        open_ = [e for e in endpoints if not e.resting(now)]
        if open_:
            return min(open_, key=lambda e: (not e.healthy, e.ejected(), e.failures, e.outstanding))
        if not endpoints:
            raise NoHealthyBackend(f"pool '{self.name}' is at its in-flight limit", reason="full")
        back = min(e.ejected_until for e in endpoints) - now
        raise NoHealthyBackend(f"every endpoint of pool '{self.name}' is ejected after failing; "
                               f"the first may be tried again in {max(back, 0.0):.1f} s",
                               retry_after_s=max(1, math.ceil(back)), reason="ejected")


def queue_limits(spec: PoolSpec) -> tuple[int, float]:
    """The pool's queue bound and longest wait. Unset, the bound is 4 x the
    pool's in-flight limit and at least 256, so a burst of a few hundred
    waits here instead of failing (vLLM itself queues without bound: only
    its running batch is bounded); and the wait is first_byte_s or 30 s,
    whichever is smaller."""
    q = spec.queue
    limits = [e.max_in_flight or spec.max_in_flight for e in spec.endpoints]
    capacity = sum(limit for limit in limits if limit is not None)
    max_waiting = q.max_waiting if q.max_waiting is not None else max(4 * capacity, 256)
    max_wait_s = q.max_wait_s if q.max_wait_s is not None else min(spec.timeouts.first_byte_s, 30.0)
    return max_waiting, max_wait_s


class HealthMonitor:
    """Active health checks: one task per pool, polling every endpoint's health path."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self._tasks: dict[Pool, asyncio.Task[None]] = {}

    def watch(self, pools: Iterable[Pool]) -> None:
        """Check exactly these pools from now on (start new ones, stop dropped ones)."""
        wanted = set(pools)
        for pool in list(self._tasks):
            if pool not in wanted:
                self._tasks.pop(pool).cancel()
        for pool in wanted - self._tasks.keys():
            self._tasks[pool] = asyncio.get_running_loop().create_task(self._run(pool))

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def check(self, pool: Pool) -> None:
        await asyncio.gather(*(self._check(pool, endpoint) for endpoint in pool.endpoints))

    async def _run(self, pool: Pool) -> None:
        while True:
            await self.check(pool)
            await asyncio.sleep(self.next_check_s(pool))

    @staticmethod
    def next_check_s(pool: Pool) -> float:
        """The pool's interval, or less while a failed check of a serving endpoint awaits the next."""
        interval = pool.spec.health.interval_s
        confirming = any(e.healthy and e.check_failures for e in pool.endpoints)
        return min(interval, CONFIRM_S) if confirming else interval

    async def _check(self, pool: Pool, endpoint: Endpoint) -> None:
        health = pool.spec.health
        timeout = min(health.interval_s, pool.spec.timeouts.connect_s)
        try:
            response = await self.client.get(endpoint.url + health.path, timeout=timeout)
            passed = response.status_code == 200
        except httpx.HTTPError:
            passed = False
        endpoint.check_failures = 0 if passed else endpoint.check_failures + 1
        pool.set_health(endpoint, endpoint.check_failures < health.unhealthy_after)
