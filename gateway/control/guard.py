"""The guard: turns speculative routing off and back on from live signals.

Every `interval_s` it reads each speculative pool's signals (acceptance, p95
latency, load) from its source and judges them:

    bad     acceptance < trip_below, or latency more than latency_regression_pct
            above the baseline (the standard pool's p95, or a recorded file)
    good    acceptance > recover_above, or at least trip_below with latency
            under the baseline (the draft measurably pays); no regression
    hold    fewer than min_draft_tokens in the window: counts for nothing

`trip_after` bad checks in a row turn the pool's guard verdict off;
`recover_after` good ones in a row turn it back on, and not sooner than
`min_hold_s` after the last flip (hysteresis). While the source cannot be
read the flags stay as they are (fail static) and `specgate_guard_up` is 0;
after `stale_after_s` of that, the verdict goes off with reason `stale`.
A check has one deadline (`check_timeout_s`) for everything it reads: a
source that answers too slowly counts as unreadable, it never holds the loop.

With `guard.classes.enabled`, traffic classes (domain x temperature bucket)
whose gateway-measured time per output token is slower on the speculative
pool than on the standard pool are taken off the pool one by one.

With a `leadership` (gateways sharing state), only the leader checks: before
each check the guard asks it for a fencing token, and after the check hands its
verdicts and the reported load to the `sink` under that token. A follower
neither reads nor judges; its flags come from the leader (see
`gateway/control/verdicts.py`). On taking the lead the streaks start again and
the next recovery waits `min_hold_s`, so a change of leader never flaps a pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from gateway.control.baseline import Baseline, BaselineError, read_baseline
from gateway.control.signals import PoolSignals, SignalError, Target, finite, settle
from gateway.decide.traffic import ClassComparison, ClassLatency
from gateway.flags import FlagStore, PoolFlag
from gateway.load import LoadReport
from gateway.metrics import GatewayMetrics
from gateway.policy.compiled import Policy
from gateway.policy.guard import GuardSpec


class SignalSource(Protocol):
    async def read(self, targets: Sequence[Target], spec: GuardSpec) -> Mapping[str, PoolSignals]: ...


class Leadership(Protocol):
    def lead(self) -> int | None:
        """The fencing token while this process leads, else None."""

    def status(self) -> dict[str, Any]: ...


class VerdictSink(Protocol):
    async def publish(self, token: int, pools: Mapping[str, PoolFlag], reported: Mapping[str, int]) -> bool: ...


class LiveState(Protocol):
    """What the guard needs of the gateway's runtime: the policy in force, read
    again at every check so reloads apply, and the report backend load goes to."""

    @property
    def policy(self) -> Policy: ...

    @property
    def reported(self) -> LoadReport: ...


@dataclass
class PoolState:
    """The state machine of one speculative pool."""
    last_flip: float
    bad: int = 0  # consecutive bad checks
    good: int = 0  # consecutive good checks
    verdict: str = "unknown"  # of the last check: bad, good, neutral, hold
    signals: PoolSignals | None = None
    baseline_pool: str | None = None
    baseline_s: float | None = None
    regression_pct: float | None = None
    classes: tuple[ClassComparison, ...] = ()
    matched: bool | None = None  # the last read found series of the pool


class Guard:
    def __init__(self, runtime: LiveState, flags: FlagStore, metrics: GatewayMetrics,
                 sources: Mapping[str, SignalSource], *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 class_latency: ClassLatency | None = None,
                 load_baseline: Callable[[str], Baseline] = read_baseline,
                 check_timeout_s: float = 10.0, leadership: Leadership | None = None,
                 sink: VerdictSink | None = None) -> None:
        self.runtime = runtime
        self.load_report = runtime.reported
        self.flags = flags
        self.metrics = metrics
        self.sources = sources
        self.clock = clock
        self.sleep = sleep
        self.class_latency = class_latency
        self.load_baseline = load_baseline
        self.check_timeout_s = check_timeout_s
        self.leadership = leadership
        self.sink = sink
        self.leading: bool | None = None  # at the last check; None before the first
        self.log = structlog.get_logger("specgate.guard")
        self.started = clock()
        self.pools: dict[str, PoolState] = {}
        self.up: bool | None = None
        self.last_ok: float | None = None
        self.last_error: str | None = None
        self.checks = 0

    async def run(self) -> None:
        """Check forever at the policy's interval (re-read every round, so reloads apply)."""
        while True:
            try:
                await self.check()
            except Exception as exc:  # noqa: BLE001 (the loop must survive anything)
                self._unreadable(f"guard check failed: {type(exc).__name__}: {exc}")
            await self.sleep(self.runtime.policy.spec.guard.interval_s)

    async def check(self) -> None:
        policy = self.runtime.policy
        spec = policy.spec.guard
        self.checks += 1
        if not spec.enabled:
            self.metrics.guard_up.set(1)  # nothing to read, nothing failing
            return
        speculative = policy.speculative_pools
        for name in list(self.pools):
            if name not in speculative:
                del self.pools[name]
        for name in speculative:
            self.pools.setdefault(name, PoolState(last_flip=self.started))
        token = self.leadership.lead() if self.leadership is not None else None
        if not self._lead(token):
            return
        await self._check(policy, spec)
        if token is not None and self.sink is not None:
            await self.sink.publish(token, {n: self.flags.get(n) for n in speculative if n in self.flags.snapshot()},
                                    self.load_report.snapshot())

    def _lead(self, token: int | None) -> bool:
        """Whether this process checks now; on taking the lead, the streaks start again."""
        leading = self.leadership is None or token is not None
        if leading and self.leading is False:
            now = self.clock()
            for state in self.pools.values():
                state.bad, state.good, state.last_flip = 0, 0, now
        if not leading:
            for state in self.pools.values():
                state.verdict, state.bad, state.good = "following", 0, 0
        self.leading = leading
        return leading

    async def _check(self, policy: Policy, spec: GuardSpec) -> None:
        speculative = policy.speculative_pools
        baselines = {n: policy.baseline_pool(n) for n in speculative}
        names = list(dict.fromkeys([*speculative, *(b for b in baselines.values() if b)]))
        targets = [Target(n, policy.pools[n].dialect, tuple(e.url for e in policy.pools[n].endpoints))
                   for n in names]
        try:
            async with asyncio.timeout(self.check_timeout_s):
                signals = await self._source(spec).read(targets, spec)
                baseline = await self._recorded_baseline(spec)
        except (SignalError, BaselineError) as exc:
            self._unreadable(str(exc))
            return
        except TimeoutError:
            self._unreadable(f"{spec.source}: no complete answer within the check's {self.check_timeout_s:g} s")
            return
        self._readable()
        signals = {name: settle(pool_signals) for name, pool_signals in signals.items()}
        # no load series now: unknown, the gateway's own count decides
        self.load_report.publish({name: load for name, pool_signals in signals.items()
                                  if (load := pool_signals.reported_load)})
        for name in speculative:
            state = self.pools[name]
            state.baseline_pool = standard = baselines[name]
            base = signals.get(standard) if standard else None
            base_s = baseline.p95(spec.latency_metric) if baseline else (
                base.p95(spec.latency_metric) if base else None)
            self._judge(name, state, signals[name], base_s, spec)
            self._note_matched(name, state, signals[name], spec)
            if spec.classes.enabled and self.class_latency is not None and standard:
                self._judge_classes(name, state, standard, policy)

    def _source(self, spec: GuardSpec) -> SignalSource:
        source = self.sources.get(spec.source)
        if source is None:
            raise SignalError(f"guard.source is {spec.source} but no such source is configured"
                              + (" (set SPECGATE_PROMETHEUS_URL)" if spec.source == "prometheus" else ""))
        return source

    async def _recorded_baseline(self, spec: GuardSpec) -> Baseline | None:
        if spec.baseline_file is None:
            return None
        # a relative file is next to the policy file, as capture's directory is: never the working directory
        path = Path(self.runtime.policy.source).parent / spec.baseline_file
        return await asyncio.to_thread(self.load_baseline, str(path))

    # Judging -----------------------------------------------------------------

    def _judge(self, name: str, state: PoolState, signals: PoolSignals, baseline_s: float | None,
               spec: GuardSpec) -> None:
        g = spec.speculative
        current = signals.p95(spec.latency_metric)
        regression = finite((current / baseline_s - 1) * 100) if current is not None and baseline_s else None
        state.signals, state.baseline_s, state.regression_pct = signals, baseline_s, regression
        acceptance = signals.acceptance_rate
        if acceptance is None or signals.volume_tokens < g.min_draft_tokens:
            state.verdict = "hold"  # thin data: neither counts nor breaks a streak
            return
        slow = regression is not None and regression > g.latency_regression_pct
        faster = regression is not None and regression < 0
        if acceptance < g.accept_rate.trip_below or slow:
            state.verdict, state.bad, state.good = "bad", state.bad + 1, 0
        elif acceptance > g.accept_rate.recover_above or faster:
            state.verdict, state.bad, state.good = "good", 0, state.good + 1
        else:
            state.verdict, state.bad, state.good = "neutral", 0, 0
        evidence = {"acceptance_rate": round(acceptance, 4), "draft_tokens": round(signals.volume_tokens, 1)}
        if regression is not None:
            evidence["latency_regression_pct"] = round(regression, 2)
        flag = self.flags.get(name)
        now = self.clock()
        if flag.guard_enabled and state.bad >= g.trip_after:
            if acceptance < g.accept_rate.trip_below:
                reason = (f"low_acceptance: acceptance {acceptance:.3f} < {g.accept_rate.trip_below} "
                          f"for {state.bad} checks")
            else:
                reason = (f"latency_regression: {spec.latency_metric} p95 {current:.4f}s is "
                          f"{regression:.1f}% over the baseline {baseline_s:.4f}s for {state.bad} checks")
            self._flip(name, state, False, reason, {**evidence, "checks": state.bad}, now)
        elif (not flag.guard_enabled and state.good >= g.recover_after
              and now - state.last_flip >= g.min_hold_s):
            if acceptance > g.accept_rate.recover_above or regression is None:
                reason = (f"recovered: acceptance {acceptance:.3f} > {g.accept_rate.recover_above} "
                          f"for {state.good} checks")
            else:
                reason = (f"recovered: {spec.latency_metric} p95 {current:.4f}s is {-regression:.1f}% under "
                          f"the baseline {baseline_s:.4f}s at acceptance {acceptance:.3f} for {state.good} checks")
            self._flip(name, state, True, reason, {**evidence, "checks": state.good}, now)

    def _note_matched(self, name: str, state: PoolState, signals: PoolSignals, spec: GuardSpec) -> None:
        """Warn once when a pool's selector finds nothing: the guard would hold for ever
        while guard_up reads 1 (say, `instance` selecting Service names behind pod IPs)."""
        matched = bool(signals.endpoints)
        if not matched and state.matched is not False:
            self.log.warning("guard_found_no_series", pool=name, source=spec.source,
                             target=f"{spec.target.label}=~{spec.target.value}",
                             action="holding; check guard.target against the scrape's labels")
        state.matched = matched

    def _flip(self, name: str, state: PoolState, enabled: bool, reason: str,
              evidence: Mapping[str, float], now: float) -> None:
        self.flags.set_guard(name, enabled, reason, evidence)
        state.last_flip, state.bad, state.good = now, 0, 0

    def _judge_classes(self, name: str, state: PoolState, standard: str, policy: Policy) -> None:
        assert self.class_latency is not None
        options = policy.spec.guard.classes
        compared = self.class_latency.compare(name, standard, policy.spec.guard.window_s, options.min_samples)
        state.classes = tuple(compared)
        slower = {c.traffic_class for c in compared if c.slower_pct > options.slower_pct}
        measured = {c.traffic_class for c in compared}
        before = self.flags.get(name).disabled_classes
        after = (before - measured) | slower  # classes without enough samples keep their state
        if after != before:
            changed = {c.traffic_class: c.to_json() for c in compared if c.traffic_class in after ^ before}
            self.flags.set_classes(name, after)
            self.log.info("class_speculation_changed", pool=name, disabled=sorted(after),
                          turned_off=sorted(after - before), turned_on=sorted(before - after),
                          slower_pct_limit=options.slower_pct, classes=changed)

    # Source health -----------------------------------------------------------

    def _readable(self) -> None:
        if self.up is not True:
            self.log.info("guard_metrics_readable")
        self.up, self.last_ok, self.last_error = True, self.clock(), None
        self.metrics.guard_up.set(1)

    def _unreadable(self, error: str) -> None:
        if self.up is not False or error != self.last_error:
            self.log.warning("guard_metrics_unreadable", error=error, action="flags kept as they are")
        self.up, self.last_error = False, error
        self.metrics.guard_up.set(0)
        self.load_report.clear()  # unknown now: routing falls back to the gateway's own count
        stale_after = self.runtime.policy.spec.guard.stale_after_s
        since = self.last_ok if self.last_ok is not None else self.started
        unread_s = self.clock() - since
        if stale_after is None or unread_s < stale_after:
            return
        now = self.clock()
        for name, state in self.pools.items():
            state.verdict = "stale"
            if name in self.flags.snapshot() and self.flags.get(name).guard_enabled:
                self._flip(name, state, False, f"stale: no metrics for {unread_s:.0f}s ({error})",
                           {"unread_s": round(unread_s, 1)}, now)

    # Reporting ---------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        spec = self.runtime.policy.spec.guard
        now = self.clock()
        pools: dict[str, Any] = {}
        snapshot = self.flags.snapshot()
        for name, state in self.pools.items():
            flag = snapshot.get(name)
            pools[name] = {
                "enabled": flag.routable if flag else None,
                "mode": flag.mode.value if flag else None,
                "guard_enabled": flag.guard_enabled if flag else None,
                "reason": flag.reason if flag else None,
                "verdict": state.verdict,
                "bad_checks": state.bad,
                "good_checks": state.good,
                "since_last_flip_s": round(now - state.last_flip, 3),
                "enough_data": state.verdict not in ("hold", "unknown", "stale"),
                "series_found": state.matched,
                "signals": state.signals.to_json() if state.signals else None,
                "latency": {"metric": spec.latency_metric, "p95_s": state.signals.p95(spec.latency_metric)
                            if state.signals else None, "baseline_s": state.baseline_s,
                            "baseline": spec.baseline_file or state.baseline_pool,
                            "regression_pct": state.regression_pct},
                "classes": {"disabled": sorted(flag.disabled_classes) if flag else [],
                            "compared": [c.to_json() for c in state.classes]},
            }
        return {
            "enabled": spec.enabled,
            "leader": self.leadership is None or self.leadership.lead() is not None,
            "leadership": self.leadership.status() if self.leadership is not None else None,
            "source": spec.source,
            "up": self.up,
            "error": self.last_error,
            "checks": self.checks,
            "interval_s": spec.interval_s,
            "window": spec.window,
            "since_last_read_s": round(now - self.last_ok, 3) if self.last_ok is not None else None,
            "pools": pools,
        }

