"""`highest_fitting`, the search every room is read with: on any non-decreasing objective it
finds what a scan of every load finds, from wherever the last room was, and in the usual
cases it reads few loads."""

from __future__ import annotations

from gateway.decide.latency_tables import highest_fitting


def search(room: int | None, below: int, start: int) -> tuple[int | None, list[int]]:
    """The search's answer where loads up to `room` fit (None: none does), and the loads it read."""
    read: list[int] = []

    def fits(load: int) -> bool:
        assert 0 <= load < below  # it reads only loads under `below`
        read.append(load)
        return room is not None and load <= room

    return highest_fitting(fits, below, start), read


def test_it_finds_what_a_scan_finds_from_any_start() -> None:
    for below in range(0, 40):
        for room in (None, *range(0, 45)):
            scanned = None if room is None or below == 0 else min(room, below - 1)
            for start in range(-1, 45):
                found, read = search(room, below, start)
                assert found == scanned, (below, room, start)
                assert len(read) == len(set(read)), (below, room, start)  # no load read twice


def test_within_its_room_a_candidate_costs_one_read() -> None:
    for start in (0, 119, 150):  # none remembered, or a room at or over the load
        found, read = search(room=200, below=120, start=start)
        assert found == 119 and read == [119]


def test_an_unmoved_room_costs_two_reads() -> None:
    found, read = search(room=90, below=250, start=90)
    assert found == 90 and read == [91, 90]


def test_a_room_grown_past_the_load_costs_two_reads() -> None:
    found, read = search(room=200, below=120, start=90)
    assert found == 119 and read == [91, 119]


def test_a_room_moved_far_is_bracketed_then_bisected() -> None:
    for room, start in ((400, 10), (10, 400)):
        found, read = search(room=room, below=1000, start=start)
        assert found == room and len(read) <= 2 * 10 + 2  # doubling steps, then a bisection of the bracket
