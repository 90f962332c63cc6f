"""Active health checks: an endpoint is down after `unhealthy_after` failed checks in a row."""

from __future__ import annotations

import asyncio
import random

import httpx

from gateway.policy.pools import PoolSpec
from gateway.upstream.pools import CONFIRM_S, HealthMonitor, Pool


def checked(*answers: int | None, **health: float) -> tuple[Pool, HealthMonitor, list[str]]:
    """A pool of one endpoint whose health path answers each status of `answers` in turn
    (None: the check times out), and the monitor that checks it."""
    script, seen = list(answers), []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        status = script.pop(0)
        if status is None:
            raise httpx.ReadTimeout("no answer", request=request)
        return httpx.Response(status)

    spec = PoolSpec.model_validate({"kind": "standard", "endpoints": [{"url": "http://127.0.0.1:9"}],
                                    "health": {"interval_s": 5, **health}})
    pool = Pool("p", spec, rng=random.Random(7))
    return pool, HealthMonitor(httpx.AsyncClient(transport=httpx.MockTransport(answer))), seen


def states(pool: Pool, monitor: HealthMonitor, checks: int) -> list[tuple[bool, float]]:
    """After each check: whether the endpoint serves, and when the next check comes."""
    async def run() -> list[tuple[bool, float]]:
        after = []
        for _ in range(checks):
            await monitor.check(pool)
            after.append((pool.endpoints[0].healthy, monitor.next_check_s(pool)))
        await monitor.client.aclose()
        return after

    return asyncio.run(run())


def test_one_failed_check_does_not_take_a_serving_endpoint_out() -> None:
    """A check that times out once (a slow moment of the backend or of this host) is
    confirmed soon after instead of taking the endpoint out for a whole interval."""
    pool, monitor, seen = checked(200, None, 200, 503, 200)
    assert states(pool, monitor, 5) == [(True, 5), (True, CONFIRM_S), (True, 5), (True, CONFIRM_S), (True, 5)]
    assert seen == ["/health"] * 5


def test_failed_checks_in_a_row_take_it_out_until_one_passes() -> None:
    pool, monitor, _ = checked(503, None, 503, 200, **{"unhealthy_after": 2})
    assert states(pool, monitor, 4) == [(True, CONFIRM_S), (False, 5), (False, 5), (True, 5)]
    assert pool.endpoints[0].check_failures == 0


def test_one_failure_is_enough_where_the_policy_says_so() -> None:
    pool, monitor, _ = checked(503, 200, **{"unhealthy_after": 1, "interval_s": 0.5})
    assert states(pool, monitor, 2) == [(False, 0.5), (True, 0.5)]
