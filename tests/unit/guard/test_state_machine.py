"""The guard's state machine, driven by a fake clock and scripted signals."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from gateway.decide.features import extract_features
from gateway.decide.routing import decide
from gateway.edge.load_view import DecisionLoad
from gateway.flags import Mode, reason_word
from tests.unit.guard.conftest import make_policy, signals

GOOD, LOW, THIN = signals(0.8), signals(0.2), signals(0.2, volume=50)


def test_trips_after_three_consecutive_low_acceptance_checks(rig_for):
    rig = rig_for()
    rig.check(LOW)
    rig.check(LOW)
    assert rig.enabled, "two bad checks are not enough"
    rig.check(LOW)
    assert not rig.enabled
    flag = rig.flags.get("speculative")
    assert reason_word(flag.reason) == "low_acceptance" and "0.200" in flag.reason
    assert flag.evidence["acceptance_rate"] == 0.2 and flag.evidence["checks"] == 3
    assert rig.guard_up() == 1


@pytest.mark.parametrize("sequence, enabled", [
    (["low", "low", "good", "low", "low"], True),  # a good check breaks the streak
    (["low", "low", "mid", "low", "low"], True),  # so does one between the thresholds
    (["low", "thin", "low", "thin", "low"], False),  # thin data neither counts nor breaks
    (["thin"] * 10, True),  # never flips on noise
    (["none"] * 5, True),  # no speculative traffic at all
])
def test_streaks(rig_for, sequence, enabled):
    rig = rig_for()
    cases = {"low": LOW, "good": GOOD, "mid": signals(0.5), "thin": THIN,
             "none": signals(acceptance=None, volume=0)}
    for name in sequence:
        rig.check(cases[name])
    assert rig.enabled is enabled
    if "thin" in sequence[-1:]:
        assert rig.guard.status()["pools"]["speculative"]["enough_data"] is False


def test_recovers_with_hysteresis_and_not_before_min_hold(rig_for):
    rig = rig_for()
    for _ in range(3):
        rig.check(LOW)
    assert not rig.enabled
    for _ in range(5):
        rig.check(signals(0.5))  # above trip_below but not above recover_above: stays off
    assert not rig.enabled
    for _ in range(5):
        rig.check(GOOD, advance=1)  # 5 good checks, but only ~10 s since the flip
    assert not rig.enabled and rig.guard.status()["pools"]["speculative"]["good_checks"] == 5
    rig.check(GOOD, advance=60)
    assert rig.enabled
    assert reason_word(rig.flags.get("speculative").reason) == "recovered"


def test_latency_regression_against_the_standard_pool(rig_for):
    rig = rig_for()
    fast, slow = signals(0.8, tpot=0.020), signals(0.8, tpot=0.030)  # 50 % over 0.020
    for _ in range(3):
        rig.check(slow, std=fast)
    assert not rig.enabled
    assert reason_word(rig.flags.get("speculative").reason) == "latency_regression"
    status = rig.guard.status()["pools"]["speculative"]["latency"]
    assert status["baseline"] == "standard" and status["regression_pct"] == pytest.approx(50)


def test_latency_within_the_limit_is_no_regression(rig_for):
    rig = rig_for()
    for _ in range(5):
        rig.check(signals(0.8, tpot=0.023), std=signals(0.8, tpot=0.020))  # 15 %
    assert rig.enabled


def test_a_draft_whose_steps_are_longer_but_whose_tokens_are_faster_is_no_regression(rig_for):
    # vLLM's itl is one sample per engine step: a drafting step is longer and yields several
    # tokens, so its itl p95 is above a plain pool's while each answer's time per token is below
    drafting = dataclasses.replace(signals(0.8, tpot=0.015), itl_p95=0.030)
    plain = dataclasses.replace(signals(None, volume=0, tpot=0.020), itl_p95=0.020)
    by_default, by_steps = rig_for(), rig_for(latency_metric="itl")
    for _ in range(3):
        by_default.check(drafting, std=plain)
        by_steps.check(drafting, std=plain)
    assert by_default.enabled
    assert by_default.guard.status()["pools"]["speculative"]["latency"]["regression_pct"] == pytest.approx(-25)
    assert not by_steps.enabled  # the per-step reading would have turned a paying draft off


def test_a_draft_between_the_thresholds_recovers_when_its_tokens_are_faster(rig_for):
    # Tripped on hot sampling; then greedy traffic: acceptance 0.45 is under recover_above,
    # but each answer's tokens come faster than on the standard pool, so the draft pays
    faster, level = rig_for(), rig_for()
    for rig in (faster, level):
        for _ in range(3):
            rig.check(LOW)
        assert not rig.enabled
    for _ in range(5):
        faster.check(signals(0.45, tpot=0.015), std=signals(None, volume=0, tpot=0.020), advance=15)
        level.check(signals(0.45, tpot=0.021), std=signals(None, volume=0, tpot=0.020), advance=15)
    assert faster.enabled
    assert faster.flags.get("speculative").reason.startswith("recovered: tpot p95 0.0150s is 25.0% under")
    assert not level.enabled  # 5 % slower, within the limit: neither bad nor good
    assert level.guard.status()["pools"]["speculative"]["verdict"] == "neutral"


def write_baseline(path: Path) -> None:
    """A baseline as `specgate baseline record` writes it: e2e p95 2.0 s."""
    path.write_text(json.dumps({
        "url": "http://127.0.0.1:9001", "model": "m", "recorded_at": "2026-01-01T00:00:00Z", "requests": 100,
        "ttft_s": {"p50": 0.05, "p95": 0.1}, "tpot_s": {"p50": 0.01, "p95": 0.02},
        "e2e_s": {"p50": 1.0, "p95": 2.0}}))


def test_latency_regression_against_a_recorded_baseline(rig_for, tmp_path):
    baseline = tmp_path / "baseline.json"
    write_baseline(baseline)
    rig = rig_for(baseline_file=str(baseline), latency_metric="e2e")
    slow = signals(0.8)
    slow = type(slow)(**{**slow.__dict__, "e2e_p95": 2.6})  # 30 % over the recorded 2.0 s
    for _ in range(3):
        rig.check(slow, std=signals(0.8, tpot=1.0))
    assert not rig.enabled
    assert rig.guard.status()["pools"]["speculative"]["latency"]["baseline_s"] == 2.0


def test_a_relative_baseline_file_is_next_to_the_policy_not_the_working_directory(rig_for, tmp_path,
                                                                                    monkeypatch):
    write_baseline(tmp_path / "baseline.json")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    policy = dataclasses.replace(make_policy(baseline_file="baseline.json", latency_metric="e2e"),
                                 source=str(tmp_path / "policy.yaml"))
    rig = rig_for(policy)
    rig.check(GOOD)
    assert rig.guard_up() == 1
    assert rig.guard.status()["pools"]["speculative"]["latency"]["baseline_s"] == 2.0


def test_unreadable_baseline_file_is_a_read_failure(rig_for, tmp_path):
    (tmp_path / "bad.json").write_text("{}")
    rig = rig_for(baseline_file=str(tmp_path / "bad.json"))
    rig.check(GOOD)
    assert rig.guard_up() == 0 and "not a baseline file" in rig.guard.status()["error"]


def test_outage_keeps_flags_then_falls_back_after_stale_after(rig_for):
    rig = rig_for(stale_after_s=30)
    rig.check(GOOD)
    rig.source.error = "prometheus at http://x unreachable: ConnectError"
    rig.check(advance=10)
    assert rig.guard_up() == 0 and rig.enabled, "fail static: flags stay"
    assert rig.guard.status()["up"] is False and "unreachable" in rig.guard.status()["error"]
    rig.check(advance=25)  # 35 s since the last good read
    assert not rig.enabled and reason_word(rig.flags.get("speculative").reason) == "stale"
    rig.source.error = None
    rig.check(GOOD)
    assert rig.guard_up() == 1 and not rig.enabled, "recovery goes through hysteresis"


def test_outage_without_stale_after_keeps_flags_forever(rig_for):
    rig = rig_for()
    rig.source.error = "down"
    for _ in range(5):
        rig.check(advance=3600)
    assert rig.enabled and rig.guard_up() == 0


def test_missing_prometheus_url_is_reported(rig_for):
    rig = rig_for()
    rig.guard.sources = {"scrape": rig.source}
    rig.check(GOOD)
    assert rig.guard_up() == 0 and "SPECGATE_PROMETHEUS_URL" in rig.guard.status()["error"]


def test_reported_load_feeds_the_pools(rig_for):
    rig = rig_for()
    rig.check(signals(0.8, running=6, waiting=3), std=signals(None, volume=0, running=2, waiting=0))
    load = DecisionLoad(rig.runtime)  # what routing reads
    assert load() == {"speculative": 9, "standard": 2}
    standard = rig.runtime.pools["standard"]
    leases = [standard.acquire() for _ in range(3)]
    assert load()["standard"] == 5, "the report plus what this gateway leased since it"
    for lease in leases:
        lease.release(ok=True)


def test_policy_reload_is_picked_up(rig_for):
    rig = rig_for()
    rig.check(LOW)
    rig.runtime.apply(make_policy(speculative={"trip_after": 2, "min_draft_tokens": 10}))
    rig.check(LOW)
    assert not rig.enabled, "the new trip_after of 2 applies at once"


def test_disabled_guard_reads_nothing(rig_for):
    rig = rig_for(enabled=False)
    for _ in range(5):
        rig.check(LOW)
    assert rig.enabled and rig.source.reads == []


def route(rig, draws):
    policy = rig.runtime.policy
    features = extract_features({"messages": [{"role": "user", "content": "hi"}]}, "chat", policy.defaults,
                                policy.classifier, {})
    return [decide(features, policy, rig.flags.snapshot(), draw) for draw in draws]


def test_probe_share_while_off_and_manual_overrides(rig_for):
    rig = rig_for(speculative={"probe_fraction": 0.05, "trip_after": 1})
    draws = [i / 100 for i in range(100)]
    rig.check(LOW)
    assert not rig.enabled
    decisions = route(rig, draws)
    probes = [d for d in decisions if d.pool == "speculative"]
    assert len(probes) == 5 and all(d.probe for d in probes)
    assert {d.pool for d in decisions if not d.probe} == {"standard"}

    rig.flags.set_mode("speculative", Mode.FORCE_OFF, reason="admin:force_off")
    assert {d.pool for d in route(rig, draws)} == {"standard"}, "force_off: not even probes"

    rig.flags.set_mode("speculative", Mode.FORCE_ON, reason="admin:force_on")
    assert {d.pool for d in route(rig, draws)} == {"speculative"}, "force_on ignores the guard"
    for _ in range(3):
        rig.check(LOW)
    assert {d.pool for d in route(rig, draws)} == {"speculative"}

    rig.flags.set_mode("speculative", Mode.AUTO, reason="admin:auto")
    assert sum(d.pool == "speculative" for d in route(rig, draws)) == 5, "auto: the guard's verdict again"


def test_status_shape(rig_for):
    rig = rig_for()
    rig.check(signals(0.8, running=2, waiting=1), std=signals(None, volume=0, tpot=0.02))
    status = rig.guard.status()
    assert {"enabled", "source", "up", "error", "checks", "interval_s", "window", "since_last_read_s",
            "pools"} <= set(status)
    pool = status["pools"]["speculative"]
    assert pool["signals"]["acceptance_rate"] == 0.8 and pool["signals"]["running"] == 2
    assert pool["verdict"] == "good" and pool["good_checks"] == 1 and pool["enough_data"] is True
    json.dumps(status, allow_nan=False)  # serialisable as it is, as strict JSON


def test_an_outage_forgets_the_reported_load(rig_for):
    rig = rig_for()
    rig.check(signals(0.8, running=6, waiting=3))
    rig.source.error = "down"
    rig.check()
    assert DecisionLoad(rig.runtime)()["speculative"] == 0


@pytest.mark.parametrize("guard, message", [
    ({"source": "scrape", "queries": {"accept_rate": "x"}}, "need source: prometheus"),
    ({"source": "scrape", "interval_s": 15, "window": "20s"}, "window >= 2 x interval_s"),
    ({"speculative": {"min_hold": 3}}, "unknown key"),
    ({"queries": {"acceptance": "x"}}, "guard.queries.acceptance"),
])
def test_guard_spec_rejects_inconsistent_settings(guard, message):
    from gateway.policy.loader import PolicyError
    with pytest.raises(PolicyError) as error:
        make_policy(**guard)
    assert message in str(error.value)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("bad", [
    signals(NAN, volume=NAN, tpot=NAN, running=NAN, waiting=NAN),
    signals(INF, volume=INF, tpot=INF, running=INF, waiting=-INF),
    signals(-INF, volume=1000, tpot=-INF, running=None, waiting=INF),
], ids=["nan", "inf", "mixed"])
def test_numbers_that_are_not_numbers_hold_and_serialise(rig_for, bad):
    rig = rig_for(speculative={"trip_after": 1, "recover_after": 1, "min_hold_s": 0})
    rig.check(signals(0.8, running=6, waiting=3))
    for _ in range(3):
        rig.check(bad, std=bad)
    assert rig.enabled and rig.guard_up() == 1
    status = rig.guard.status()
    pool = status["pools"]["speculative"]
    assert pool["verdict"] == "hold" and pool["signals"]["acceptance_rate"] is None
    assert DecisionLoad(rig.runtime)()["speculative"] == 0
    json.dumps(status, allow_nan=False)  # JSON has no NaN: the admin API answers this as it is


def test_acceptance_above_one_is_clamped_before_it_is_judged(rig_for):
    rig = rig_for()
    rig.check(signals(1.7))
    assert rig.guard.status()["pools"]["speculative"]["signals"]["acceptance_rate"] == 1.0


def test_an_empty_load_answer_clears_the_reported_load(rig_for):
    rig = rig_for()
    rig.check(signals(0.8, running=6, waiting=3))
    assert DecisionLoad(rig.runtime)()["speculative"] == 9
    rig.check(signals(0.8, running=None, waiting=None))
    assert DecisionLoad(rig.runtime)()["speculative"] == 0


class TricklingSource:
    """Answers one step of `steps` at a time; records whether the guard cut it off."""

    def __init__(self, steps: int = 400) -> None:
        self.steps = steps
        self.cancelled = False
        self.finished = False

    async def read(self, targets, spec):
        try:
            for _ in range(self.steps):
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True
        return {}


def test_a_check_has_one_deadline_for_everything_it_reads(rig_for):
    rig = rig_for(stale_after_s=30)
    slow = TricklingSource()
    rig.guard.sources = {"prometheus": slow}
    rig.guard.check_timeout_s = 0.2
    rig.check(GOOD)
    assert slow.cancelled and not slow.finished
    assert rig.guard_up() == 0 and "no complete answer within the check's 0.2 s" in rig.guard.status()["error"]
    assert rig.enabled, "fail static at first"
    rig.check(GOOD, advance=31)
    assert not rig.enabled and reason_word(rig.flags.get("speculative").reason) == "stale"


def test_a_selector_that_finds_no_series_shows_in_the_status(rig_for):
    rig = rig_for()
    found = signals(0.8)
    found = type(found)(**{**found.__dict__, "endpoints": {"10.0.0.1:8000": signals(0.8)}})
    rig.check(found)
    assert rig.guard.status()["pools"]["speculative"]["series_found"] is True
    rig.check(signals(acceptance=None, volume=0, running=None, waiting=None))
    pool = rig.guard.status()["pools"]["speculative"]
    assert pool["series_found"] is False and pool["verdict"] == "hold" and rig.guard_up() == 1
