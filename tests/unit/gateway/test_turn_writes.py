"""`TurnWrites`: what a connection writes in one turn of the loop leaves at the
end of that turn, in order, in one write; nothing is reordered or lost."""

from __future__ import annotations

import asyncio

from gateway.edge.http_protocol import TurnWrites


class Recording(asyncio.Transport):
    """A transport that keeps what is written to it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))
        self.events.append("write")

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def is_closing(self) -> bool:
        return self.closing


async def turn() -> None:
    """Let the loop run the callbacks scheduled so far."""
    await asyncio.sleep(0)


def coalescing() -> tuple[TurnWrites, Recording]:
    bare = Recording()
    return TurnWrites(bare, asyncio.get_running_loop()), bare


def test_the_writes_of_one_turn_are_one_write_at_its_end():
    async def main() -> tuple[list[bytes], list[bytes]]:
        writes, bare = coalescing()
        writes.write(b"HTTP/1.1 200 OK\r\n\r\n")
        writes.write(b"{}")
        before = list(bare.writes)
        await turn()
        writes.write(b"next")
        await turn()
        return before, bare.writes

    assert asyncio.run(main()) == ([], [b"HTTP/1.1 200 OK\r\n\r\n{}", b"next"])


def test_closing_sends_what_waits_first_and_aborting_drops_it():
    async def main() -> tuple[list[str], list[bytes], list[str]]:
        closed, closed_bare = coalescing()
        closed.write(b"head")
        closed.write(b"body")
        closed.close()
        aborted, aborted_bare = coalescing()
        aborted.write(b"head")
        aborted.abort()
        await turn()  # the scheduled flushes find nothing left to send
        return closed_bare.events, closed_bare.writes, aborted_bare.events

    assert asyncio.run(main()) == (["write", "close"], [b"headbody"], ["abort"])


def test_nothing_is_written_to_a_connection_already_closing():
    async def main() -> list[bytes]:
        writes, bare = coalescing()
        writes.write(b"late")
        bare.closing = True  # the client went before the end of the turn
        await turn()
        return bare.writes

    assert asyncio.run(main()) == []
