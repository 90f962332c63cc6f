"""Forwarding to a pool, with retries before the first byte and the pool's
fallback chain after them.

`Forwarder.open` sends the request to an endpoint of the pool and returns
once response headers arrive. Connect errors and 429/502/503/504 answers are
retried on another endpoint while attempts and the pool's retry budget last.
`Forwarder.open_first` walks a pool's fallback chain: a pool that cannot take
the request (no endpoint free, unreachable, 429/502/503 after its retries)
hands it to the next. Nothing is retried once a byte has gone to the client
(see relay.py). When the pools that could take it are all merely full (at
their in-flight limit, not unhealthy), the request waits for a slot in their
queues (queue.py) up to the routed pool's `queue.max_wait_s`, then is answered
503 with Retry-After. A request the queues will not hold for its priority
(full of waiters no lower than it, or evicted by a higher one), or below a
saturated pool's `priority.shed_below`, is answered 429 with Retry-After
(`Shed`, docs/priorities.md).

Every lease is taken through the request's `Claim` (claim.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import httpx

from gateway.errors import AtCapacity, InvalidRequest, NoHealthyBackend, Shed, UpstreamUnreachable
from gateway.upstream.answer import Answer
from gateway.upstream.claim import Claim
from gateway.upstream.failures import HEADER_TIMEOUTS, BeforeHeaders, upstream_error
from gateway.upstream.pools import Endpoint, Lease, Pool
from gateway.upstream.prompt_key import PromptKey
from gateway.upstream.queue import Evicted, Ticket, WaitQueue, wait
from gateway.upstream.queue_metrics import QueueMetrics
from gateway.upstream.read_timer import DeadlineReached
from gateway.upstream.target import Target
from gateway.upstream.upstream import Upstream

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# After its retries, a pool answering these passes the request down its fallback chain.
FALLBACK_STATUSES = frozenset({429, 502, 503})


class Standing:
    """What decides a request's place while pools are saturated: its priority
    and each pool's load as routing read it (`priority.busy_load` is compared with it).
    A plain class, as `Outbound` is."""

    def __init__(self, priority: int = 0, load: Mapping[str, int] = MappingProxyType({})) -> None:
        self.priority = priority
        self.load = load

    def shed_by(self, pool: Pool, full: bool) -> bool:
        """Whether `pool`, saturated (`full`, or busy by its load), sheds this request."""
        spec = pool.spec.priority
        if spec.shed_below is None or self.priority >= spec.shed_below:
            return False
        return full or (spec.busy_load is not None and self.load.get(pool.name, 0) >= spec.busy_load)


class ChainFull(Exception):
    """Inside the forwarder, never answered: a walk found no pool to take the
    request and some of them only full. `queues` are those pools' queues."""

    def __init__(self, queues: list[WaitQueue]) -> None:
        super().__init__("every pool of the chain that could take the request is full")
        self.queues = queues


class Outbound:
    """The request as one pool gets it. A plain class, built per pool tried: mypyc compiles the
    `__init__` written out, where a named tuple's `__new__` runs interpreted. Read-only by convention."""

    def __init__(self, path: str, headers: list[tuple[str, str]], body: bytes, header_timeout_s: float,
                 deadline: float | None = None, method: str = "POST", key: PromptKey | None = None,
                 home: str | None = None, idle_s: float | None = None) -> None:
        self.path = path
        self.headers = headers
        self.body = body
        self.header_timeout_s = header_timeout_s
        self.deadline = deadline  # event-loop time; bounds the whole exchange, body included
        self.method = method
        self.key = key  # the prompt and session the pool's balancer reads
        self.home = home  # the URL of the only endpoint that may serve it (it holds the request's state)
        self.idle_s = idle_s  # the silence allowed between a stream's chunks after the first


class Opened:
    """An answer whose headers are in, and the lease it holds (a plain class, built per request)."""

    def __init__(self, response: Answer, lease: Lease, ttfb_s: float) -> None:
        self.response = response
        self.lease = lease
        self.ttfb_s = ttfb_s


class Forwarder:
    """Opens a request on a chain of upstreams; `on_error(pool, kind)` and
    `on_retry(pool)` count what happened on the way."""

    def __init__(self, on_error: Callable[[Pool, str], None], on_retry: Callable[[Pool], None],
                 waits: QueueMetrics | None = None) -> None:
        self.on_error = on_error
        self.on_retry = on_retry
        self.waits = waits or QueueMetrics()

    async def open_first(self, chain: Sequence[Upstream], outbound: Callable[[Pool], Outbound],
                         claim: Claim, degraded: bool = False, standing: Standing | None = None) -> Opened:
        """Open on the first of `chain` (a pool, then its fallback chain) that takes
        the request; the last one's answer stands, and so does its error
        unless a pool of the chain was only full: then the request waits
        for a slot, or is shed for its priority."""
        standing = standing or Standing()
        routed = chain[0].pool.name
        try:
            try:
                opened = await self._walk(chain, outbound, claim, degraded, standing)
            except ChainFull as full:
                opened = await self._queued(chain, outbound, claim, degraded, full, standing)
        except Shed as shed:
            self.waits.shed(routed, standing.priority, shed.reason)
            raise
        self.waits.admitted(routed, standing.priority)
        return opened

    async def _walk(self, chain: Sequence[Upstream], outbound: Callable[[Pool], Outbound], claim: Claim,
                    degraded: bool, standing: Standing, ticket: Ticket | None = None) -> Opened:
        """One walk down the chain. Nothing has reached the client yet, so
        moving on costs it nothing. `ticket`: a wake-up from one pool's queue.
        A pool saturated for the request's priority is passed over like a full one."""
        full: list[WaitQueue] = []
        shed = False
        for i, upstream in enumerate(chain):
            last = i == len(chain) - 1
            pool = upstream.pool
            mine = ticket if ticket is not None and ticket.queue is pool.queue else None
            try:
                if standing.shed_by(pool, full=False):
                    raise AtCapacity(f"pool '{pool.name}' is busy", reason="busy")
                opened = await self.open(upstream, outbound(pool), claim, degraded=degraded, ticket=mine)
            except (NoHealthyBackend, UpstreamUnreachable) as exc:
                if isinstance(exc, AtCapacity):
                    if standing.shed_by(pool, full=True):
                        shed = True
                    else:
                        full.append(pool.queue)
                if last:
                    if full:
                        raise ChainFull(full) from None
                    if shed:
                        raise _shed(chain[0].pool, standing.priority) from None
                    raise
                claim.fallback = claim.fallback or _why(exc)
                continue
            status = opened.response.status_code
            if last or status not in FALLBACK_STATUSES:
                return opened
            await claim.give_back(ok=status == 429, why=f"status_{status}")  # busy is not broken
            self.on_error(pool, f"status_{status}")
            claim.fallback = claim.fallback or f"status_{status}"
        raise NoHealthyBackend("no pool to send the request to")

    async def _queued(self, chain: Sequence[Upstream], outbound: Callable[[Pool], Outbound], claim: Claim,
                      degraded: bool, full: ChainFull, standing: Standing) -> Opened:
        """Wait in the full pools' queues, then walk the chain again; a waiter
        woken that finds no slot after all waits again, first among its priority."""
        routed = chain[0].pool
        limits = routed.queue
        now = asyncio.get_running_loop().time()
        deadline = min(now + limits.max_wait_s, outbound(routed).deadline or math.inf)
        outcome, waited_since, woken = "failed", None, False
        try:
            while True:
                queues = [q for q in full.queues if q.takes(standing.priority)]
                if not queues:
                    outcome = "full"
                    raise Shed(f"pool '{routed.name}' and its fallbacks are at their in-flight limit and their "
                               "queues are full of requests of no lower priority: retry later",
                               retry_after_s=_after(limits))
                waited_since = waited_since or now
                ticket = await self._wait(queues, deadline, woken, standing.priority)
                if ticket is None:
                    outcome = "timeout"
                    raise AtCapacity(f"no slot came free on pool '{routed.name}' or its fallbacks within "
                                     f"{deadline - waited_since:.3g} s: retry later", retry_after_s=_after(limits))
                try:
                    opened: Opened | None = await self._walk(chain, outbound, claim, degraded, standing, ticket)
                except ChainFull as again:
                    full, woken, opened = again, True, None
                finally:
                    ticket.redeem()
                if opened is None:  # not a `continue` in the `except`: mypyc compiles that one wrongly
                    continue
                outcome = "served"
                return opened
        except Evicted:
            outcome = "evicted"
            raise Shed("a request of higher priority took this one's place in the queue of pool "
                       f"'{routed.name}': retry later", retry_after_s=_after(limits), reason="evicted") from None
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            seconds = None if waited_since is None else asyncio.get_running_loop().time() - waited_since
            claim.waited_s = seconds
            self.waits.waited(routed.name, outcome, seconds)
            if seconds is not None:
                self.waits.queued(routed.name, standing.priority, seconds)

    async def _wait(self, queues: list[WaitQueue], deadline: float, first: bool, priority: int) -> Ticket | None:
        """`wait`, with the waiting gauge of the queues it joins kept up."""
        try:
            for queue in queues:
                self.waits.waiting(queue.pool, min(queue.waiting + 1, queue.max_waiting))
            return await wait(queues, deadline, first, priority)
        finally:
            for queue in queues:
                self.waits.waiting(queue.pool, queue.waiting)

    async def open(self, upstream: Upstream, outbound: Outbound, claim: Claim, *,
                   degraded: bool = False, ticket: Ticket | None = None) -> Opened:
        """Open on one pool, retrying on its other endpoints. With a `ticket`
        the first attempt may pass the pool's waiters; a retry always may
        (the request gave its own slot back)."""
        pool = claim.pool = upstream.pool
        t = pool.timeouts
        # The transport applies "read" to the wait for headers and to every later read:
        # no separate timer per request on the hot path.
        timeouts = {"connect": t.connect_s, "read": outbound.header_timeout_s, "write": t.connect_s,
                    "pool": t.first_byte_s, "idle": outbound.idle_s or outbound.header_timeout_s}
        tried: list[Endpoint] = []
        # a request pinned to its home endpoint is never retried elsewhere
        elsewhere = [] if outbound.home is None else [e for e in pool.endpoints if e.url != outbound.home]
        started = time.perf_counter()
        while True:
            try:
                lease = claim.take(pool, exclude=[*tried, *elsewhere], degraded=degraded,
                                   admitted=ticket is not None or bool(tried), key=outbound.key)
            finally:
                if ticket is not None:
                    ticket.redeem()
            if not tried:
                upstream.budget.deposit()
            tried.append(lease.endpoint)
            try:
                response = await upstream.send(outbound.method, _target(lease.endpoint, outbound.path),
                                               outbound.headers, outbound.body, timeouts, outbound.deadline)
            except UnicodeEncodeError as exc:  # a header that is not ASCII, before anything went; the edge checks first
                raise InvalidRequest(f"the request cannot be forwarded: {exc}") from None
            except httpx.TransportError as exc:
                timed_out = isinstance(exc, HEADER_TIMEOUTS)
                kind = "deadline" if isinstance(exc, DeadlineReached) else "timeout" if timed_out else "connect"
                # the request's own deadline says nothing of the endpoint
                await claim.give_back(ok=None if kind == "deadline" else False, why=kind)
                self.on_error(pool, kind)
                if timed_out or not self._may_retry(upstream, tried, degraded, elsewhere):
                    raise upstream_error(exc, BeforeHeaders(pool.name, outbound.header_timeout_s,
                                                            len(tried))) from None
                continue
            claim.response = response
            if response.status_code in RETRY_STATUSES and self._may_retry(upstream, tried, degraded, elsewhere):
                await claim.give_back(ok=response.status_code == 429,  # busy is not broken
                                      why=f"status_{response.status_code}")
                self.on_error(pool, f"status_{response.status_code}")
                continue
            return Opened(response, lease, time.perf_counter() - started)

    def _may_retry(self, upstream: Upstream, tried: list[Endpoint], degraded: bool = False,
                   elsewhere: Sequence[Endpoint] = ()) -> bool:
        """Another attempt needs attempts left, an endpoint not tried yet that is
        available (an ejected one waits for its back-off; in degraded mode any
        endpoint not full and not between trials will do), and budget."""
        pool = upstream.pool
        now = pool.clock()
        usable = [e for e in pool.endpoints if e not in tried and e not in elsewhere
                  and (not e.full() and not e.resting(now) if degraded else e.available(now))]
        if len(tried) >= pool.spec.retry.attempts or not usable:
            return False
        if not upstream.budget.withdraw():
            return False
        self.on_retry(pool)
        return True


def _target(endpoint: Endpoint, path: str) -> Target:
    """`path` on `endpoint`, or a 400 when httpx cannot parse it; the edge checks for this first."""
    try:
        return endpoint.target_for(path)
    except httpx.InvalidURL as exc:
        raise InvalidRequest(f"the request cannot be forwarded: {exc}") from None


def _why(exc: NoHealthyBackend | UpstreamUnreachable) -> str:
    """The fallback's cause: unreachable, or the pool's own (ejected, unhealthy, full, busy)."""
    return "unreachable" if isinstance(exc, UpstreamUnreachable) else exc.reason


def _shed(routed: Pool, priority: int) -> Shed:
    return Shed(f"pool '{routed.name}' and its fallbacks are saturated and shed requests of priority {priority}: "
                "retry later", retry_after_s=_after(routed.queue), reason="below_threshold")


def _after(queue: WaitQueue) -> int:
    """Retry-After for a request the queue could not hold: the longest wait it
    gives, so a retry finds the queue turned over."""
    return max(1, math.ceil(queue.max_wait_s))
