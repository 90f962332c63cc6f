"""`HeadHold`: the response head waits for the end of the loop's turn and goes
out with what follows it in that turn; nothing is reordered or lost."""

from __future__ import annotations

import asyncio

from gateway.edge.http_protocol import HeadHold


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


def held() -> tuple[HeadHold, Recording]:
    bare = Recording()
    hold = HeadHold(bare, asyncio.get_running_loop())
    hold.hold_next()
    return hold, bare


def test_a_head_and_its_body_in_one_turn_are_one_write():
    async def main() -> list[bytes]:
        hold, bare = held()
        hold.write(b"HTTP/1.1 200 OK\r\n\r\n")
        hold.write(b"{}")
        await turn()
        hold.write(b"next")  # only the head of a cycle is held
        return bare.writes

    assert asyncio.run(main()) == [b"HTTP/1.1 200 OK\r\n\r\n{}", b"next"]


def test_a_head_alone_goes_out_at_the_end_of_the_turn():
    async def main() -> tuple[list[bytes], list[bytes]]:
        hold, bare = held()
        hold.write(b"head")
        before = list(bare.writes)
        await turn()
        return before, bare.writes

    assert asyncio.run(main()) == ([], [b"head"])


def test_closing_sends_the_held_head_first_and_aborting_drops_it():
    async def main() -> tuple[list[str], list[str]]:
        closed, closed_bare = held()
        closed.write(b"head")
        closed.close()
        aborted, aborted_bare = held()
        aborted.write(b"head")
        aborted.abort()
        await turn()  # the scheduled flush finds nothing left to send
        return closed_bare.events, aborted_bare.events

    assert asyncio.run(main()) == (["write", "close"], ["abort"])
