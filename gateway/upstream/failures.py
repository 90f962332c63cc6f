"""The one translation of a failure talking to a backend (httpx errors,
timeouts) into the envelope error the client gets."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from gateway.errors import DeadlineExceeded, UpstreamError, UpstreamTimeout, UpstreamUnreachable
from gateway.upstream.read_timer import DeadlineReached

# Before the answer's headers, only these are a timeout: a connect timeout is an
# unreachable endpoint (and another one may be tried).
HEADER_TIMEOUTS = (httpx.ReadTimeout, httpx.PoolTimeout)
# Once the answer began, any timeout is one.
BODY_TIMEOUTS = (TimeoutError, httpx.TimeoutException)


@dataclass(frozen=True, slots=True)
class BeforeHeaders:
    """A failure while a pool was asked for its answer's headers."""
    pool: str
    header_timeout_s: float
    attempts: int


def upstream_error(exc: BaseException, before: BeforeHeaders | None = None) -> UpstreamError:
    """A timeout is a 504, anything else (connect errors, a broken connection)
    a 502. `before` is given when the answer's headers had not come yet. The
    request's own deadline is `DeadlineExceeded`: its outcome, not the endpoint's."""
    if isinstance(exc, DeadlineReached):
        return DeadlineExceeded("the request's total time (the pool's total_s) ran out before the answer ended")
    if before is None:
        if isinstance(exc, BODY_TIMEOUTS):
            return UpstreamTimeout("the backend stopped sending within the pool's timeout")
        return UpstreamUnreachable(f"the backend connection broke: {type(exc).__name__}")
    if isinstance(exc, HEADER_TIMEOUTS):
        return UpstreamTimeout(f"pool '{before.pool}' sent no response within {before.header_timeout_s:g} s")
    return UpstreamUnreachable(f"pool '{before.pool}' is unreachable after {before.attempts} "
                               f"attempt(s): {type(exc).__name__}")
