"""The proxy's HTTP/1.1 transport against real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import httpx
import pytest

from gateway.upstream.target import Target
from gateway.upstream.transport import PooledTransport
from tests.fakes.vllm import FakeVllm
from tests.unit.gateway.raw_server import Handler, RawServer, read_request


def request(url: str, read: float = 5.0) -> httpx.Request:
    return httpx.Request("POST", url + "/v1/x", content=b"{}",
                         extensions={"timeout": {"connect": 2, "read": read, "pool": 2}})


async def exchange(transport: PooledTransport, url: str, read: float = 5.0,
                   via_httpx: bool = False) -> tuple[int, bytes]:
    """One POST and its whole answer, through `send` (the proxy's way) or httpx's way."""
    if via_httpx:
        response = await transport.handle_async_request(request(url, read))
        try:
            return response.status_code, await response.aread()
        finally:
            await response.aclose()
    answer = await transport.send("POST", Target(httpx.URL(url + "/v1/x")), [], b"{}",
                                  {"connect": 2, "read": read, "pool": 2}, None)
    try:
        return answer.status_code, await answer.aread()
    finally:
        await answer.aclose()


@pytest.mark.parametrize("method, headers, body", [
    ("POST", [("content-type", "application/json"), ("x-request-id", "r1")], b'{"a": 1}'),
    ("POST", [], b""),
    ("GET", [("accept", "*/*")], b""),
])
def test_send_writes_what_httpx_would(method, headers, body):
    """The proxy's way writes the request httpx's own transport writes: the same line, Host,
    headers and length, byte for byte."""
    async def main() -> list[bytes]:
        seen: list[bytes] = []

        async def handler(reader, writer):
            while True:
                try:
                    seen.append(await read_request(reader))
                except asyncio.IncompleteReadError:
                    return
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

        async with RawServer(handler) as url:
            target = httpx.URL(url + "/v1/x?q=1")
            ours = PooledTransport()
            answer = await ours.send(method, Target(target), headers, body, {"read": 5}, None)
            assert (answer.status_code, await answer.aread()) == (200, b"ok")
            await ours.aclose()
            async with httpx.AsyncHTTPTransport() as theirs:
                response = await theirs.handle_async_request(httpx.Request(method, target, headers=headers,
                                                                           content=body))
                assert await response.aread() == b"ok"
        return seen

    ours, theirs = asyncio.run(main())
    assert ours == theirs


@pytest.mark.parametrize("via_httpx", [False, True])
def test_keep_alive_connections_are_reused(via_httpx):
    async def main() -> None:
        async def handler(reader, writer):
            while True:
                try:
                    await read_request(reader)
                except asyncio.IncompleteReadError:
                    return
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

        server = RawServer(handler)
        async with server as url:
            transport = PooledTransport()
            for _ in range(5):
                results = await asyncio.gather(*(exchange(transport, url, via_httpx=via_httpx) for _ in range(8)))
                assert results == [(200, b"ok")] * 8
            assert server.connections == 8  # one per concurrent request, reused five times
            await transport.aclose()

    asyncio.run(main())


def test_chunked_and_connection_close_responses():
    async def main() -> None:
        async def handler(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
                         b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            await writer.drain()

        server = RawServer(handler)
        async with server as url:
            transport = PooledTransport()
            assert await exchange(transport, url) == (200, b"hello world")
            assert await exchange(transport, url) == (200, b"hello world")
            assert server.connections == 2  # "connection: close" is honoured
            await transport.aclose()

    asyncio.run(main())


def test_idle_connection_closed_by_the_server_is_replaced():
    async def main() -> None:
        async def handler(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
            # then close without saying so: the pooled connection goes stale

        server = RawServer(handler)
        async with server as url:
            transport = PooledTransport()
            for _ in range(3):
                assert await exchange(transport, url) == (200, b"ok")
                await asyncio.sleep(0.05)
            assert server.connections == 3
            await transport.aclose()

    asyncio.run(main())


def test_server_closing_mid_response_is_a_protocol_error():
    async def main() -> None:
        async def handler(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
            await writer.drain()

        async with RawServer(handler) as url:
            transport = PooledTransport()
            response = await transport.handle_async_request(request(url))
            with pytest.raises(httpx.RemoteProtocolError):
                await response.aread()
            await response.aclose()
            await transport.aclose()

    asyncio.run(main())


def test_read_timeout_and_connect_error():
    async def main() -> None:
        async def handler(reader, writer):
            await read_request(reader)
            await asyncio.sleep(2)

        async with RawServer(handler) as url:
            transport = PooledTransport()
            with pytest.raises(httpx.ReadTimeout):
                await exchange(transport, url, read=0.2)
            with pytest.raises(httpx.ConnectError):
                await exchange(transport, "http://127.0.0.1:9")
            await transport.aclose()

    asyncio.run(main())


def test_pool_limit_makes_requests_wait_then_time_out():
    async def main() -> None:
        release = asyncio.Event()

        async def handler(reader, writer):
            await read_request(reader)
            await release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

        async with RawServer(handler) as url:
            transport = PooledTransport(httpx.Limits(max_connections=1))
            first = asyncio.ensure_future(exchange(transport, url))
            await asyncio.sleep(0.1)
            blocked = httpx.Request("POST", url + "/v1/x", content=b"{}",
                                    extensions={"timeout": {"pool": 0.2, "read": 5, "connect": 2}})
            with pytest.raises(httpx.PoolTimeout):
                await transport.handle_async_request(blocked)
            release.set()
            assert await first == (200, b"ok")
            await transport.aclose()

    asyncio.run(main())


def test_streams_from_a_real_server_through_httpx():
    async def main(url: str) -> None:
        async with httpx.AsyncClient(transport=PooledTransport()) as client:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
                lines = [line async for line in response.aiter_lines() if line]
            assert lines[-1] == "data: [DONE]"
            health = await client.get(url + "/health")
            assert health.status_code == 200

    with FakeVllm() as fake:
        asyncio.run(main(fake.url))


def test_deadline_bounds_a_trickling_body():
    async def main() -> None:
        async def handler(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
            for _ in range(100):  # one byte every 50 ms: never a read timeout, 5 s in all
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.05)

        async with RawServer(handler) as url:
            transport = PooledTransport()
            loop = asyncio.get_running_loop()
            started = loop.time()
            trickle = httpx.Request("POST", url + "/v1/x", content=b"{}", extensions={
                "timeout": {"connect": 2, "read": 1.0, "pool": 2}, "deadline": started + 0.5})
            response = await transport.handle_async_request(trickle)
            with pytest.raises(httpx.ReadTimeout):
                await response.aread()
            assert loop.time() - started < 0.8
            await response.aclose()
            await transport.aclose()

    asyncio.run(main())


def serve_each(*answers: bytes) -> Handler:
    """A handler that answers the requests of one connection in turn with `answers`;
    a pause between an answer's parts (split on b"|") makes them arrive apart."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            for part in answer.split(b"|"):
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(0.01)
        await reader.read()  # keep the connection open until the client closes it

    return handler


def send(transport: PooledTransport, url: str, method: str = "POST") -> Awaitable[httpx.Response]:
    return transport.handle_async_request(httpx.Request(
        method, url + "/v1/x", content=b"{}" if method != "HEAD" else b"",
        extensions={"timeout": {"connect": 2, "read": 5, "pool": 2}}))


def test_interim_responses_are_skipped_and_the_final_one_is_returned():
    async def main() -> None:
        server = RawServer(serve_each(
            b"HTTP/1.1 100 Continue\r\n\r\n|HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n|"
            b"HTTP/1.1 200 OK\r\nx-final: yes\r\ncontent-length: 3\r\n\r\none",
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\ntwo"))
        async with server as url:
            transport = PooledTransport()
            first = await send(transport, url)
            assert first.status_code == 200
            assert first.headers.get("x-final") == "yes" and "link" not in first.headers
            assert await first.aread() == b"one"
            await first.aclose()
            # the same connection, and the next request gets its own answer
            assert await exchange(transport, url) == (200, b"two")
            assert server.connections == 1
            await transport.aclose()

    asyncio.run(main())


def test_head_response_ends_with_its_headers_and_the_connection_is_reused():
    async def main() -> None:
        server = RawServer(serve_each(
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ncontent-type: application/json\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"))
        async with server as url:
            transport = PooledTransport()
            head = await send(transport, url, "HEAD")
            assert head.status_code == 200 and head.headers["content-length"] == "100"
            assert await head.aread() == b""
            await head.aclose()
            assert await exchange(transport, url) == (200, b"ok")
            assert server.connections == 1
            await transport.aclose()

    asyncio.run(main())


def test_no_body_statuses_keep_the_connection():
    async def main() -> None:
        server = RawServer(serve_each(b"HTTP/1.1 204 No Content\r\n\r\n",
                                      b"HTTP/1.1 304 Not Modified\r\netag: x\r\n\r\n",
                                      b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"))
        async with server as url:
            transport = PooledTransport()
            assert await exchange(transport, url) == (204, b"")
            assert await exchange(transport, url) == (304, b"")
            assert await exchange(transport, url) == (200, b"ok")
            assert server.connections == 1
            await transport.aclose()

    asyncio.run(main())


def test_switching_protocols_is_refused():
    async def main() -> None:
        server = RawServer(serve_each(
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\nraw bytes"))
        async with server as url:
            transport = PooledTransport()
            with pytest.raises(httpx.RemoteProtocolError):
                await send(transport, url)
            await transport.aclose()

    asyncio.run(main())


def test_bytes_after_the_final_response_are_dropped_with_the_connection():
    async def main() -> None:
        server = RawServer(serve_each(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale",
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfresh"))
        async with server as url:
            transport = PooledTransport()
            assert await exchange(transport, url) == (200, b"ok")
            assert await exchange(transport, url) == (200, b"ok")  # a new connection's first answer
            assert server.connections == 2
            await transport.aclose()

    asyncio.run(main())


def test_a_closed_answer_is_never_read_again():
    """Its connection went back to the pool and may carry the next request's answer."""
    async def main() -> None:
        server = RawServer(serve_each(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst",
                                      b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecond"))
        async with server as url:
            transport = PooledTransport()
            first = await transport.send("POST", Target(httpx.URL(url + "/v1/x")), [], b"{}", {"read": 5}, None)
            assert await first.aread() == b"first"
            assert await exchange(transport, url) == (200, b"second")  # on the same connection
            with pytest.raises(httpx.StreamClosed):
                await first.aread()
            assert server.connections == 1
            await transport.aclose()

    asyncio.run(main())
