"""A class's preferred pool in the log: a change at once after a quiet
period, the changes within one folded into a line, none for changes that end
where they started."""

from __future__ import annotations

from structlog.testing import capture_logs

from gateway.decide.fastest import Fastest
from gateway.edge.preferred import PreferredPools


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def found(best: str, traffic: str = "chat/greedy") -> Fastest:
    return Fastest(best, best, (), traffic, 64, False)


def lines(logs: list[dict]) -> list[tuple[str, str, int]]:
    return [(e["before"], e["after"], e["changes"]) for e in logs if e["event"] == "preferred_pool_changed"]


def test_the_first_decision_sets_the_preference_without_a_line():
    with capture_logs() as logs:
        PreferredPools(clock=Clock()).note("default", found("a"))
    assert lines(logs) == []


def test_a_change_after_quiet_is_logged_at_once_and_once():
    clock = Clock()
    preferred = PreferredPools(quiet_s=10, clock=clock)
    with capture_logs() as logs:
        for best in "aabbbb":
            preferred.note("default", found(best))
    assert lines(logs) == [("a", "b", 1)]


def test_alternation_within_the_quiet_period_is_folded_into_one_line_after_it():
    clock = Clock()
    preferred = PreferredPools(quiet_s=10, clock=clock)
    with capture_logs() as logs:
        preferred.note("default", found("a"))
        for best in "ba" * 50 + "b":  # under load: 101 changes within a second
            clock.now += 0.01
            preferred.note("default", found(best))
        assert lines(logs) == [("a", "b", 1)]
        clock.now = 10.0  # the first line went out at 0.01: still quiet
        preferred.note("default", found("b"))
        assert lines(logs) == [("a", "b", 1)]
        clock.now = 10.02
        preferred.note("default", found("a"))  # settles on `a`: told, with every change since the line
        preferred.note("default", found("a"))
    assert lines(logs) == [("a", "b", 1), ("b", "a", 101)]


def test_changes_that_end_on_the_logged_pool_are_no_line():
    clock = Clock()
    preferred = PreferredPools(quiet_s=10, clock=clock)
    with capture_logs() as logs:
        for best in "ab":
            preferred.note("default", found(best))
        for best in "abab":  # within the quiet period; ends on `b`, the pool last logged
            clock.now += 1
            preferred.note("default", found(best))
        clock.now = 20
        for best in "bbb":
            preferred.note("default", found(best))
        clock.now = 21
        preferred.note("default", found("a"))  # the count started again: a change after quiet
    assert lines(logs) == [("a", "b", 1), ("b", "a", 1)]


def test_classes_and_rules_are_told_apart():
    clock = Clock()
    preferred = PreferredPools(quiet_s=10, clock=clock)
    with capture_logs() as logs:
        for rule, traffic, best in [("r", "chat/greedy", "a"), ("r", "code/greedy", "b"), ("s", "chat/greedy", "b"),
                                    ("r", "chat/greedy", "b"), ("r", "code/greedy", "b")]:
            preferred.note(rule, found(best, traffic))
    assert [(e["rule"], e["traffic_class"], e["before"], e["after"]) for e in logs] == [
        ("r", "chat/greedy", "a", "b")]
