"""The scrubbing process: capture's prompts are scrubbed in a process of its own.

Scrubbing holds the GIL (regular expressions, presidio's recognizers): a
prompt near the 256 KiB `max_prompt_bytes` takes about 1 s, and in the
gateway's interpreter that second was the event loop's too. So the capture
stage owns one `ScrubWorker`: a child process (started with "spawn", so it
shares nothing with the gateway's threads) that builds the `Scrubber` for a
phone region, then answers batches over a pipe. A batch is plain data (the
offered prompts: JSON values); the answer is the record lines, ready to be
appended, and the count of finds per placeholder. The gateway never imports
presidio, spaCy or torch for capture.

`serve` is what runs in the child; `records` is its work, one batch.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import signal
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from gateway.capture.scrub import Scrubber

Offered = tuple[float, str, str | None, Any, int]  # time, endpoint, traffic class, messages or prompt, size
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class WorkerDied(Exception):
    """The scrubbing process is gone (killed, out of memory) or its pipe is closed."""


class ScrubberFailed(Exception):
    """The scrubber could not be built in the worker (`missing`: a module not installed)."""

    def __init__(self, error: str, missing: str | None) -> None:
        super().__init__(error)
        self.error = error
        self.missing = missing


class ScrubWorker:
    """The gateway's handle on one scrubbing process. Its methods block (a round
    trip through the pipe): the capture stage calls them from a worker thread."""

    def __init__(self, region: str) -> None:
        """Start the process and wait until its scrubber is built (seconds: presidio's imports)."""
        context = multiprocessing.get_context("spawn")
        self.region = region
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=serve, args=(theirs, region), name="specgate-scrub", daemon=True)
        self.process.start()
        theirs.close()  # its end is the child's: the child's exit then reads as the end of the pipe here
        self.pid: int | None = self.process.pid
        self.closed = False
        status, error, missing = self._receive()
        if status != "ready":
            self.close()
            raise ScrubberFailed(error, missing)

    @property
    def alive(self) -> bool:
        return not self.closed and self.process.is_alive()

    def scrub(self, batch: list[Offered]) -> tuple[list[str], dict[str, int]]:
        """The batch's record lines (a prompt with no text has none) and the finds per placeholder."""
        try:
            self.conn.send(batch)
        except OSError as exc:  # the child is gone: a broken pipe
            raise WorkerDied(type(exc).__name__) from exc
        status, lines, counts = self._receive()
        if status != "done":
            raise RuntimeError(lines)  # the scrubber raised in the child: its error's name
        return lines, counts

    def close(self) -> None:
        """End the process now (what it was scrubbing is lost) and reap it."""
        self.closed = True
        self.process.kill()
        self.process.join()
        self.conn.close()

    def _receive(self) -> Any:
        try:
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            raise WorkerDied(type(exc).__name__) from exc


def serve(conn: Connection, region: str) -> None:
    """The child's life: build the scrubber, say so, then scrub each batch until the pipe ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the gateway, which ends this
    try:
        scrubber = Scrubber(region)
    except Exception as exc:  # the gateway logs it; without the scrubbing libraries nothing is written
        conn.send(("failed", type(exc).__name__, exc.name if isinstance(exc, ImportError) else None))
        return
    gc.collect()
    gc.freeze()  # the build's ~420k objects, out of this process's collections
    conn.send(("ready", None, None))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):  # the gateway closed its end, or exited
            return
        reply: tuple[Any, ...]
        try:
            reply = ("done", *records(batch, scrubber))
        except Exception as exc:
            reply = ("failed", type(exc).__name__, None)
        try:
            conn.send(reply)
        except OSError:
            return


def records(batch: list[Offered], scrubber: Scrubber) -> tuple[list[str], dict[str, int]]:
    """One JSON line per offered prompt with text: its messages scrubbed, with the traffic class,
    the endpoint and the time; and the count of finds per placeholder."""
    lines: list[str] = []
    counts: dict[str, int] = {}
    for at, endpoint, traffic_class, prompt, _ in batch:
        messages = _messages(prompt)
        if not messages:
            continue
        for message in messages:
            message["content"], found = scrubber.scrub(message["content"])
            for placeholder, count in found.items():
                counts[placeholder] = counts.get(placeholder, 0) + count
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)), "class": traffic_class,
                  "endpoint": endpoint, "messages": messages}
        lines.append(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
    return lines, counts


def _messages(prompt: Any) -> list[dict[str, str]]:
    """Role and text of each message; a completions prompt is one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}] if prompt else []
    if not isinstance(prompt, list):
        return []
    out: list[dict[str, str]] = []
    for message in prompt:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "\n".join(part["text"] for part in content
                                if isinstance(part, Mapping) and isinstance(part.get("text"), str))
        if isinstance(content, str) and content:
            role = message["role"] if message["role"] in ROLES else "other"  # a free string is not kept
            out.append({"role": role, "content": content})
    return out
