"""A deliberately fast fake OpenAI backend for overhead benchmarks.

A bare asyncio protocol (no framework) so that the backend is never the
bottleneck: it answers `/v1/chat/completions` with a fixed JSON body, or, when
the request body asks for `"stream": true`, with CHUNKS server-sent events
written one by one, and `/health` with 200. HTTP/1.1 keep-alive, no delays.

    python bench/fast_upstream.py --port 9101 [--chunks 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

try:
    import uvloop
except ImportError:  # optional
    uvloop = None

CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)")
STREAM = re.compile(rb'"stream"\s*:\s*true')
COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * 16},
                 "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24},
}).encode()


def sse_body(chunks: int) -> list[bytes]:
    events = []
    for i in range(chunks):
        data = json.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
                           "model": "bench", "choices": [{"index": 0, "delta": {"content": f"t{i} "},
                                                          "finish_reason": None}]})
        events.append(f"data: {data}\n\n".encode())
    events.append(b"data: [DONE]\n\n")
    return [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


def response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: " + content_type +
            b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class Handler(asyncio.Protocol):
    """Reads requests into one growing buffer: a head is searched for once, and a
    large body is waited for by its length, never by rescanning or re-copying
    what already arrived (that is quadratic in the body's size)."""

    def __init__(self, stream_chunks: list[bytes]) -> None:
        self.stream_chunks = stream_chunks
        self.buffer = bytearray()
        self.pending: tuple[bytes, int, int] | None = None  # a parsed head, where its body starts and ends

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream protocol is handed a Transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.pending is None:
                head_end = self.buffer.find(b"\r\n\r\n")
                if head_end < 0:
                    return
                head = bytes(self.buffer[:head_end]).lower()
                match = CONTENT_LENGTH.search(head)
                self.pending = (head, head_end + 4, head_end + 4 + (int(match.group(1)) if match else 0))
            head, start, end = self.pending
            if len(self.buffer) < end:
                return
            self.pending = None
            with memoryview(self.buffer) as view, view[start:end] as body:  # read in place, not copied
                self.answer(head, body)
            del self.buffer[:end]

    def answer(self, head: bytes, body: memoryview) -> None:
        path = head.split(b" ", 2)[1]
        if path.startswith(b"/health"):
            self.transport.write(response(b"200 OK", b"application/json", b"{}"))
        elif STREAM.search(body):
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                 b"transfer-encoding: chunked\r\n\r\n")
            for chunk in self.stream_chunks:
                self.transport.write(chunk)
        else:
            self.transport.write(response(b"200 OK", b"application/json", COMPLETION))


async def serve(host: str, port: int, chunks: int) -> None:
    stream_chunks = sse_body(chunks)
    server = await asyncio.get_running_loop().create_server(lambda: Handler(stream_chunks), host, port,
                                                            backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9101)
    parser.add_argument("--chunks", type=int, default=16)
    args = parser.parse_args()
    if uvloop is not None:
        uvloop.install()
    asyncio.run(serve(args.host, args.port, args.chunks))


if __name__ == "__main__":
    main()
