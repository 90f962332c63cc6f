"""Leases always come back: neutral releases, the request's Claim, and the
forwarder's paths that raise between taking a lease and handing it over."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from gateway.errors import InvalidRequest, NoHealthyBackend, Shed, UpstreamUnreachable
from gateway.policy.compiled import Policy
from gateway.policy.loader import parse_policy
from gateway.policy.pools import PoolSpec
from gateway.upstream.claim import Claim
from gateway.upstream.pools import Pool
from gateway.upstream.proxy import Forwarder, Outbound
from gateway.upstream.upstream import Upstream


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_pool(name: str = "p", endpoints: int = 1, clock: Clock | None = None, **spec) -> Pool:
    urls = [{"url": f"http://127.0.0.1:{9000 + i}"} for i in range(endpoints)]
    return Pool(name, PoolSpec(kind="standard", endpoints=urls, **spec), clock=clock or Clock(),
                rng=random.Random(7))


def books(*pools: Pool) -> list[int]:
    """Every in-flight count the pools keep."""
    return [n for pool in pools for n in (pool.in_flight, *(e.outstanding for e in pool.endpoints))]


def forwarder(errors: list[str] | None = None) -> Forwarder:
    noted = errors if errors is not None else []
    return Forwarder(on_error=lambda pool, kind: noted.append(f"{pool.name}:{kind}"), on_retry=lambda pool: None)


def chain(handlers: dict[str, httpx.AsyncBaseTransport], *pools: Pool) -> list[Upstream]:
    return [Upstream(pool, handlers[pool.name]) for pool in pools]


def outbound(pool: Pool, headers: list[tuple[str, str]] | None = None, path: str = "/v1/completions") -> Outbound:
    return Outbound(path, headers or [], b"{}", header_timeout_s=5.0)


def test_a_neutral_release_says_nothing_of_the_endpoint():
    pool = make_pool()
    endpoint = pool.endpoints[0]
    pool.acquire().release(ok=False)
    pool.acquire().release(ok=None)
    assert (endpoint.failures, books(pool)) == (1, [0, 0])


def test_a_half_open_trial_released_neutrally_lets_the_next_trial_happen():
    clock = Clock()
    pool = make_pool(clock=clock)
    endpoint = pool.endpoints[0]
    for _ in range(pool.spec.health.eject_after):
        pool.acquire(degraded=True).release(ok=False)
    backoff = endpoint.backoff_s
    clock.now += backoff
    trial = pool.acquire()
    assert trial.trial
    with pytest.raises(NoHealthyBackend):
        pool.acquire()  # one trial at a time
    trial.release(ok=None)  # the client left: no verdict
    assert endpoint.backoff_s == backoff and endpoint.ejected()
    assert pool.acquire().trial  # the next request may try


def test_a_claim_gives_back_once_and_the_gauge_follows_the_pool():
    pool = make_pool()
    gauge: list[int] = []
    claim = Claim(lambda p, delta: gauge.append(delta))
    claim.take(pool, exclude=(), degraded=False)
    with pytest.raises(RuntimeError):
        claim.take(pool, exclude=(), degraded=False)
    assert (pool.in_flight, sum(gauge)) == (1, 1)

    async def give_back_twice() -> None:
        await claim.give_back(None)
        await claim.give_back(False)

    asyncio.run(give_back_twice())
    assert (books(pool), sum(gauge), pool.endpoints[0].failures) == ([0, 0], 0, 0)


def test_a_header_httpx_cannot_encode_is_a_400_and_the_lease_comes_back():
    pool = make_pool()
    claim = Claim()
    transport = httpx.MockTransport(lambda request: httpx.Response(200))

    async def main() -> None:
        with pytest.raises(InvalidRequest):
            await forwarder().open(Upstream(pool, transport), outbound(pool, [("x-trace", "caf\xe9")]), claim)
        await claim.give_back(None)

    asyncio.run(main())
    assert (books(pool), pool.endpoints[0].failures) == ([0, 0], 0)


class Stuck(httpx.AsyncBaseTransport):
    """Never answers; notes that a request arrived."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.arrived.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_a_request_cancelled_before_its_headers_gives_its_lease_back_neutrally():
    pool = make_pool()
    claim = Claim()

    async def main() -> None:
        stuck = Stuck()
        opening = asyncio.ensure_future(forwarder().open(Upstream(pool, stuck), outbound(pool), claim))
        await stuck.arrived.wait()
        assert books(pool) == [1, 1]
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        await claim.give_back(None)  # the owner's last word, whatever raised

    asyncio.run(main())
    assert (books(pool), pool.endpoints[0].failures) == ([0, 0], 0)


def policy(fallbacks: dict[str, str | None]) -> Policy:
    pools = "".join(f"  {name}: {{kind: standard, endpoints: [{{url: 'http://127.0.0.1:1'}}]"
                    f"{f', fallback: {to}' if to else ''}}}\n" for name, to in fallbacks.items())
    return parse_policy(f"version: 1\npools:\n{pools}rules: [{{name: all, route: a}}]\n")


@pytest.mark.parametrize("fallbacks,start,chain", [
    ({"a": None}, "a", ["a"]),
    ({"a": "b", "b": None}, "a", ["a", "b"]),
    ({"a": "b", "b": "c", "c": None}, "b", ["b", "c"]),
])
def test_the_fallback_chain_is_walked_in_one_place(fallbacks, start, chain):
    assert list(policy(fallbacks).fallback_chains[start]) == chain


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


def test_the_fallback_chain_takes_what_a_pool_cannot():
    first, second = make_pool("first"), make_pool("second")
    errors: list[str] = []
    claim = Claim()
    handlers = {"first": httpx.MockTransport(refuse),
                "second": httpx.MockTransport(lambda request: httpx.Response(200, text="ok"))}

    async def main() -> int:
        opened = await forwarder(errors).open_first(chain(handlers, first, second), outbound, claim)
        status = opened.response.status_code
        await claim.give_back(True)
        return status

    assert asyncio.run(main()) == 200
    assert (claim.pool, claim.fallback) == (second, "unreachable")
    assert errors == ["first:connect"]
    assert books(first, second) == [0, 0, 0, 0]


@pytest.mark.parametrize("status,verdict", [(503, 1), (429, 0)])
def test_a_busy_or_failing_pool_passes_on_and_the_last_answer_stands(status, verdict):
    first, second = make_pool("first"), make_pool("second")
    claim = Claim()
    handlers = {"first": httpx.MockTransport(lambda request: httpx.Response(status)),
                "second": httpx.MockTransport(lambda request: httpx.Response(status))}

    async def main() -> int:
        opened = await forwarder().open_first(chain(handlers, first, second), outbound, claim)
        got = opened.response.status_code
        await claim.give_back(None)
        return got

    assert asyncio.run(main()) == status  # nothing after the second: its answer goes to the client
    assert (claim.pool, claim.fallback) == (second, f"status_{status}")
    assert first.endpoints[0].failures == verdict  # 429 is busy, not broken
    assert books(first, second) == [0, 0, 0, 0]


def test_the_last_pool_error_stands_and_nothing_is_held():
    # a pool that holds no waiters: full answers at once, 429 (shed: it may be retried)
    first, second = make_pool("first"), make_pool("second", max_in_flight=1, queue={"max_waiting": 0})
    second.acquire()  # full
    claim = Claim()
    handlers = {"first": httpx.MockTransport(refuse), "second": httpx.MockTransport(refuse)}

    async def main() -> None:
        with pytest.raises(Shed):
            await forwarder().open_first(chain(handlers, first, second), outbound, claim)

    asyncio.run(main())
    assert (claim.pool, claim.fallback, claim.lease) == (second, "unreachable", None)
    assert books(first) == [0, 0] and books(second) == [1, 1]

    async def alone() -> None:
        with pytest.raises(UpstreamUnreachable):
            await forwarder().open_first(chain(handlers, first), outbound, Claim())

    asyncio.run(alone())
    assert books(first) == [0, 0]
