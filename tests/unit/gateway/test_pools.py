"""Endpoint picking, passive ejection with back-off, half-open trials."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from gateway.errors import AtCapacity, NoHealthyBackend
from gateway.policy.pools import PoolSpec
from gateway.upstream.pools import Pool


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_pool(*weights: float, clock=None, **spec) -> Pool:
    endpoints = [{"url": f"http://127.0.0.1:{9000 + i}", "weight": w} for i, w in enumerate(weights)]
    return Pool("p", PoolSpec(kind="standard", endpoints=endpoints, **spec), clock=clock or Clock(),
                rng=random.Random(7))


def test_least_outstanding_wins_between_two_choices():
    pool = make_pool(1, 1)
    busy = pool.acquire()
    picks = Counter(pool.acquire().endpoint.url for _ in range(1))
    assert busy.endpoint.url not in picks  # with one busy endpoint, the idle one is chosen


def test_weights_shape_the_traffic():
    pool = make_pool(1, 3)
    counts = Counter()
    for _ in range(4000):
        lease = pool.acquire()
        counts[lease.endpoint.url] += 1
        lease.release(ok=True)
    share = counts["http://127.0.0.1:9001"] / 4000
    assert 0.8 < share < 0.98  # idle endpoints tie on load, so weight decides: 1 - (1/4)^2 = 0.94


def test_max_in_flight_is_respected():
    pool = make_pool(1, max_in_flight=2)
    pool.acquire(), pool.acquire()
    with pytest.raises(NoHealthyBackend):
        pool.acquire()
    with pytest.raises(NoHealthyBackend):
        pool.acquire(degraded=True)  # full is full, even degraded


def test_ejection_after_consecutive_failures_then_half_open_trial():
    clock = Clock()
    pool = make_pool(1, 1, clock=clock)
    bad = pool.endpoints[0]
    for _ in range(3):  # eject_after defaults to 3
        lease = pool.acquire(exclude=[pool.endpoints[1]])
        lease.release(ok=False)
    assert bad.ejected() and not bad.available(clock())
    assert all(pool.acquire().endpoint is pool.endpoints[1] for _ in range(20))

    clock.now += pool.spec.health.backoff_s  # back-off over: one trial request only
    trial = pool.acquire(exclude=[pool.endpoints[1]])
    assert trial.endpoint is bad and trial.trial
    with pytest.raises(NoHealthyBackend):
        pool.acquire(exclude=[pool.endpoints[1]])
    trial.release(ok=False)  # trial failed: ejected again, for twice as long
    assert bad.backoff_s == 2 * pool.spec.health.backoff_s
    clock.now += bad.backoff_s
    trial = pool.acquire(exclude=[pool.endpoints[1]])
    trial.release(ok=True)
    assert not bad.ejected() and bad.failures == 0


def test_all_ejected_means_no_request_until_the_first_back_off_ends():
    clock = Clock()
    pool = make_pool(1, 1, clock=clock)
    first, second = pool.endpoints
    for _ in range(pool.spec.health.eject_after):
        pool.acquire(exclude=[second]).release(ok=False)
    clock.now += first.backoff_s
    pool.acquire(exclude=[second]).release(ok=False)  # its trial fails: twice the back-off
    for _ in range(pool.spec.health.eject_after):
        pool.acquire(exclude=[first]).release(ok=False)
    assert not pool.has_available() and second.ejected_until < first.ejected_until
    with pytest.raises(NoHealthyBackend) as refused:  # degraded or not: a back-off is a back-off
        pool.acquire(degraded=True)
    first_back = pool.endpoints[1].ejected_until - clock.now
    assert refused.value.headers["retry-after"] == str(math.ceil(first_back))
    clock.now += first_back  # the one ejected for the shorter time may have its trial
    trial = pool.acquire(degraded=True)
    assert trial.endpoint is pool.endpoints[1] and trial.trial
    with pytest.raises(NoHealthyBackend):
        pool.acquire(degraded=True)  # one trial at a time


def test_degraded_mode_takes_what_the_health_check_failed_but_never_a_resting_endpoint():
    clock = Clock()
    pool = make_pool(1, 1, 1, clock=clock)
    resting, *checked_out = pool.endpoints
    for _ in range(pool.spec.health.eject_after):
        pool.acquire(exclude=checked_out).release(ok=False)
    for endpoint in checked_out:
        pool.set_health(endpoint, False)
    picks = {pool.acquire(degraded=True).endpoint for _ in range(6)}
    assert picks == set(checked_out)
    with pytest.raises(NoHealthyBackend):  # the retry of a request that tried both others
        pool.acquire(exclude=checked_out, degraded=True)


def test_lease_release_is_idempotent_and_load_returns_to_zero():
    pool = make_pool(1)
    lease = pool.acquire()
    assert pool.in_flight == 1
    lease.release(ok=True)
    lease.release(ok=True)
    assert pool.in_flight == 0 and pool.endpoints[0].outstanding == 0



def test_a_lease_knows_the_pools_mean_load_while_it_was_held():
    # one request alone for 1 s, then three more for 2 s, then it alone again for 1 s:
    # (1 x 1 + 4 x 2 + 1 x 1) / 4 = 2.5 in flight, itself included
    clock = Clock()
    pool = make_pool(1, clock=clock)
    lease = pool.acquire()
    clock.now += 1
    others = [pool.acquire() for _ in range(3)]
    clock.now += 2
    for other in others:
        other.release(ok=True)
    clock.now += 1
    assert lease.mean_load is None  # not until it is given back
    lease.release(ok=True)
    assert lease.mean_load == pytest.approx(2.5)
    assert [o.mean_load for o in others] == [pytest.approx(4.0)] * 3
    quick = pool.acquire()  # given back at the instant it was taken: no time, no mean
    quick.release(ok=True)
    assert quick.mean_load is None and pool.in_flight == 0


def test_endpoint_limits_bound_the_pool_and_its_free_slots():
    pool = Pool("p", PoolSpec(kind="standard", max_in_flight=2, endpoints=[
        {"url": "http://127.0.0.1:9000", "max_in_flight": 1}, {"url": "http://127.0.0.1:9001"}]),
        clock=Clock(), rng=random.Random(7))
    leases = [pool.acquire() for _ in range(3)]
    assert pool.free() == 0 and [e.outstanding for e in pool.endpoints] == [1, 2]
    with pytest.raises(AtCapacity):  # full, not broken: the request may wait
        pool.acquire(degraded=True)
    leases[0].release(ok=True)
    assert pool.free() == 1
    first = pool.endpoints[0]
    pool.set_health(pool.endpoints[1], False)  # an unhealthy endpoint's room is no slot
    assert pool.free() == 1 - first.outstanding


def test_the_pools_timeouts_are_its_specs_every_one():
    """The request path reads a pool's timeouts off `Pool.timeouts`, copied from the spec once."""
    pool = make_pool(1.0, timeouts={"connect_s": 1.5, "first_byte_s": 2.5, "total_s": 30.0, "idle_s": 4.0})
    spec = pool.spec.timeouts
    assert vars(pool.timeouts) == spec.model_dump() == {"connect_s": 1.5, "first_byte_s": 2.5, "total_s": 30.0,
                                                         "idle_s": 4.0}


def test_what_the_request_path_reads_of_a_pools_spec_is_the_specs(monkeypatch: pytest.MonkeyPatch):
    """The model, context length, pacing and key a pool's requests read, copied from the spec once;
    the key itself is read from the environment on each request."""
    pool = make_pool(1.0, model="served-name", max_model_len=4096, pacing={"enabled": True, "max_delay_ms": 40},
                     api_key="os.environ/SPECGATE_TEST_POOL_KEY")
    assert (pool.model, pool.max_model_len, pool.pacing_delay_s) == ("served-name", 4096, pytest.approx(0.04))
    monkeypatch.delenv("SPECGATE_TEST_POOL_KEY", raising=False)
    assert pool.upstream_api_key() is None
    monkeypatch.setenv("SPECGATE_TEST_POOL_KEY", "sk-pool")
    assert pool.upstream_api_key() == "sk-pool"
    plain = make_pool(1.0)
    assert (plain.model, plain.max_model_len, plain.pacing_delay_s, plain.upstream_api_key()) == (None, None, None,
                                                                                                  None)
