"""Ports handed to test servers lie outside the kernel's ephemeral range and are free."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.serving.server import bind_socket
from tests.fakes import process
from tests.fakes.process import LOWEST_PORT, free_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="the kernel's ephemeral range is read from Linux's /proc")
def test_a_port_is_outside_the_ephemeral_range_where_no_connection_can_take_it() -> None:
    ephemeral = int(RANGE.read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(LOWEST_PORT <= port < ephemeral for port in ports)
    with bind_socket("127.0.0.1", ports[0]) as sock:
        sock.listen()


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with bind_socket("127.0.0.1", 0) as held:
        held.listen()
        taken = held.getsockname()[1]
        other = free_port()
        offers = iter([taken, other])
        monkeypatch.setattr(process, "_ephemeral_start", lambda: 65536)
        monkeypatch.setattr(process._PORTS, "randrange", lambda low, high: next(offers))
        assert free_port() == other
