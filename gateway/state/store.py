"""`StateStore`: the one Redis (or Valkey) client a gateway shares state through.

The store owns the client built from `SPECGATE_STATE_URL` (redis://, rediss://,
unix://), names the keys (`specgate:{namespace}:...`) and knows whether the
server answers: `up`, the gauge `specgate_state_up`, one warning per outage
and one line when it is back. The parts that share something through it run
their own background tasks and report each command's outcome here; the
request path never awaits Redis.

Every loop that talks to Redis goes through `repeat`, which survives any
error: a connection error marks the store down and backs off, anything else is
logged, and the loop carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.metrics import GatewayMetrics

T = TypeVar("T")

# What a failed Redis command raises: the client's own errors and the socket's.
STATE_ERRORS: tuple[type[Exception], ...] = (RedisError, OSError)

PING_INTERVAL_S = 0.5
MAX_BACKOFF_S = 1.0


class StateStore:
    def __init__(self, url: str, namespace: str = "default", metrics: GatewayMetrics | None = None,
                 timeout_s: float = 1.0) -> None:
        self.namespace = namespace
        self.metrics = metrics
        self.timeout_s = timeout_s
        # One retry at most: the loops retry on their own schedule, and a down
        # server must not hold a background task in the client's backoff.
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1), health_check_interval=5)
        self.log = structlog.get_logger("specgate.state")
        self.up = False
        self.down_since: float | None = None  # monotonic; None while up or before the first answer
        self._answered = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._record_up(False)

    def key(self, *parts: str) -> str:
        """`specgate:{namespace}:part:part`: every key and channel the gateways use."""
        return ":".join(("specgate", self.namespace, *parts))

    # Outcomes ------------------------------------------------------------------

    def succeeded(self) -> None:
        """A command answered: the store is up (a line when it comes back)."""
        if not self.up and self.down_since is not None:
            self.log.info("state_store_up", outage_s=round(time.monotonic() - self.down_since, 3))
        self.down_since = None
        self._record_up(True)
        self._answered.set()

    def failed(self, part: str, error: BaseException) -> None:
        """A command failed: the store is down; the first failure of an outage warns."""
        if self.metrics is not None:
            self.metrics.state_errors.labels(part).inc()
        if self.up or self.down_since is None:
            self.down_since = time.monotonic()
            self.log.warning("state_store_down", part=part, error=f"{type(error).__name__}: {error}",
                             action="serving with the last-known shared state")
        self._record_up(False)
        self._answered.clear()

    async def run(self, part: str, command: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """Run one command (or pipeline) and record its outcome; errors propagate."""
        try:
            result = await command(self.client)
        except STATE_ERRORS as exc:
            self.failed(part, exc)
            raise
        self.succeeded()
        return result

    async def wait_up(self, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for the store to answer; True when it did."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answered.wait(), timeout_s)
        return self.up

    # Background loops ----------------------------------------------------------

    async def repeat(self, part: str, step: Callable[[], Awaitable[object]], interval_s: float) -> None:
        """Run `step` every `interval_s` for ever; back off while the store is down."""
        failures = 0
        task = asyncio.current_task()
        while True:
            try:
                await step()
                failures = 0
            except asyncio.CancelledError:
                raise
            except STATE_ERRORS as exc:
                failures += 1
                if self.up:  # the step did not go through `run`
                    self.failed(part, exc)
            except Exception as exc:  # noqa: BLE001 (a bug in one step must not end the loop or the app)
                failures += 1
                self.log.error("state_loop_error", part=part, error=f"{type(exc).__name__}: {exc}")
            if task is not None and task.cancelling():
                # The client can swallow a cancellation or turn it into a connection error: stop all the same.
                raise asyncio.CancelledError
            await asyncio.sleep(backoff(interval_s, failures))

    async def ping(self) -> None:
        await self.run("ping", lambda client: client.ping())

    def start(self) -> None:
        """The health loop: `up` and the gauge follow the server even when no part writes."""
        self._tasks.append(asyncio.create_task(self.repeat("ping", self.ping, PING_INTERVAL_S)))

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.client.aclose()

    def _record_up(self, up: bool) -> None:
        self.up = up
        if self.metrics is not None:
            self.metrics.state_up.set(int(up))


def backoff(interval_s: float, failures: int) -> float:
    """The pause before the next try: the interval, doubled per failure in a row, capped."""
    if failures == 0:
        return interval_s
    return min(max(interval_s, 0.05) * float(2 ** min(failures, 6)), MAX_BACKOFF_S)
