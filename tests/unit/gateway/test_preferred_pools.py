"""A class's preferred pool in the log: a change at once after a quiet
period, the changes within one folded into a line, none for changes that end
where they started."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from gateway.decide.fastest import Fastest
from gateway.edge.preferred import PreferredPools


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def preferred(clock: Clock) -> PreferredPools:
    return PreferredPools(quiet_s=10, clock=clock)


def note(preferred: PreferredPools, bests: str) -> None:
    for best in bests:
        preferred.note("default", found(best))


def found(best: str, traffic: str = "chat/greedy") -> Fastest:
    return Fastest(best, best, (), traffic, 64, False)


def lines(logs: list[dict]) -> list[tuple[str, str, int]]:
    return [(e["before"], e["after"], e["changes"]) for e in logs if e["event"] == "preferred_pool_changed"]


def test_the_first_decision_sets_the_preference_without_a_line(preferred: PreferredPools):
    with capture_logs() as logs:
        preferred.note("default", found("a"))
    assert lines(logs) == []


def test_a_change_after_quiet_is_logged_at_once_and_once(preferred: PreferredPools):
    with capture_logs() as logs:
        note(preferred, "aabbbb")
    assert lines(logs) == [("a", "b", 1)]


def test_alternation_within_the_quiet_period_is_folded_into_one_line_after_it(clock: Clock,
                                                                              preferred: PreferredPools):
    with capture_logs() as logs:
        note(preferred, "a")
        for best in "ba" * 50 + "b":  # under load: 101 changes within a second
            clock.now += 0.01
            note(preferred, best)
        assert lines(logs) == [("a", "b", 1)]
        clock.now = 10.0  # the first line went out at 0.01: still quiet
        note(preferred, "b")
        assert lines(logs) == [("a", "b", 1)]
        clock.now = 10.02
        note(preferred, "aa")  # settles on `a`: told, with every change since the line
    assert lines(logs) == [("a", "b", 1), ("b", "a", 101)]


def test_changes_that_end_on_the_logged_pool_are_no_line(clock: Clock, preferred: PreferredPools):
    with capture_logs() as logs:
        note(preferred, "ab")
        for best in "abab":  # within the quiet period; ends on `b`, the pool last logged
            clock.now += 1
            note(preferred, best)
        clock.now = 20
        note(preferred, "bbb")
        clock.now = 21
        note(preferred, "a")  # the count started again: a change after quiet
    assert lines(logs) == [("a", "b", 1), ("b", "a", 1)]


def test_classes_and_rules_are_told_apart(preferred: PreferredPools):
    with capture_logs() as logs:
        for rule, traffic, best in [("r", "chat/greedy", "a"), ("r", "code/greedy", "b"), ("s", "chat/greedy", "b"),
                                    ("r", "chat/greedy", "b"), ("r", "code/greedy", "b")]:
            preferred.note(rule, found(best, traffic))
    assert [(e["rule"], e["traffic_class"], e["before"], e["after"]) for e in logs] == [
        ("r", "chat/greedy", "a", "b")]
