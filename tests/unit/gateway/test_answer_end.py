"""An answer tells when its body has been read to the end (`Answer.ended`), so the relay writes a
stream's last events with its end and waits for no read that only reports it."""

from __future__ import annotations

import asyncio

import httpx

from gateway.upstream.answer import Answer
from gateway.upstream.target import Target
from gateway.upstream.transport import PooledTransport
from tests.unit.gateway.raw_server import RawServer, read_request


def test_an_answer_says_when_its_body_was_read_to_the_end():
    """`ended` is true once the read that holds the body's last byte returned, not before, and not
    once the answer is closed; a body still coming is not ended."""
    async def main() -> None:
        go_on = asyncio.Event()

        async def handler(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            await go_on.wait()  # the rest only once the first part was read
            writer.write(b"4\r\nlast\r\n0\r\n\r\n")
            await writer.drain()
            await read_request(reader)  # the second request, on the connection the first gave back
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nwhole")
            await writer.drain()

        server = RawServer(handler)
        async with server as url:
            transport = PooledTransport()
            target, timeouts = Target(httpx.URL(url + "/v1/x")), {"read": 5}
            answer = await transport.send("POST", target, [], b"{}", timeouts, None)
            chunks = answer.aiter_raw()
            assert not answer.ended()  # nothing read yet
            assert await anext(chunks) == b"first"
            assert not answer.ended()  # the rest is still to come
            go_on.set()
            assert await anext(chunks) == b"last"
            assert answer.ended()
            await answer.aclose()
            assert not answer.ended(), "closed: its connection may carry another answer now"
            whole = await transport.send("POST", target, [], b"{}", timeouts, None)
            rest, body = whole.aiter_raw(), b""
            while not whole.ended():  # a length-framed body ends too
                body += await anext(rest)
            assert body == b"whole"
            assert server.connections == 1
            await whole.aclose()
            await transport.aclose()

    asyncio.run(main())


def test_an_answer_read_through_httpx_never_says_it_ended():
    response = httpx.Response(200, stream=httpx.ByteStream(b"all"))
    assert not Answer.of(response).ended()
