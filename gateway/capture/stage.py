"""The capture stage: the edge offers a request, a background task scrubs and writes it.

`offer` is all the request path pays: a share draw, the prompt's length (a
walk over its strings, no copy) and a non-blocking put on a queue bounded in
prompts and in bytes; a prompt over `max_prompt_bytes` is skipped
(`too_large`), and one the queue has no room for is dropped (`queue_full`),
both counted. The task takes what is queued, scrubs it (see
`scrub.Scrubber`) and appends it (see `files.CaptureFiles`) in a worker
thread, never on the event loop. A record keeps the prompt messages (role,
one of the known roles, and text, scrubbed), the traffic class, the endpoint
and the time: never names, tool arguments, the answer, headers or keys.
Logs carry counts, never prompt text.

The scrubber is built by `prepare`, in a worker thread, before the gateway
serves (its start-up awaits it), and again only when a reload turns capture on
or changes its phone region. Its build imports presidio: seconds, and about
450k objects that live as long as the process; they are then frozen out of the
garbage collector's generations (`gc.freeze`), so later full collections, which
stall the event loop, no longer walk them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from gateway.capture.files import CaptureFiles
from gateway.capture.scrub import Scrubber
from gateway.decide import apis
from gateway.metrics import GatewayMetrics
from gateway.policy.capture import CaptureSpec

Offered = tuple[float, str, str | None, Any, int]  # time, endpoint, traffic class, messages or prompt, size
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
BATCH = 64  # the most records one worker-thread call scrubs and writes
PRUNE_EVERY_S = 600.0  # with no prompt for this long, files past retention are deleted anyway


class Capture:
    """`base`: where a relative `directory` is, the policy file's folder (never
    the process's working directory)."""

    def __init__(self, spec: CaptureSpec, metrics: GatewayMetrics, rng: random.Random | None = None,
                 base: Path | None = None) -> None:
        self.metrics = metrics
        self.base = base or Path.cwd()
        self.rng = rng or random.Random()
        self.log = structlog.get_logger("specgate.capture")
        self.scrubber: Scrubber | None = None
        self.spec = spec
        self.queue: asyncio.Queue[Offered] = asyncio.Queue(maxsize=spec.queue)
        self.queued_bytes = 0  # the text waiting in the queue
        self.files = _files(spec, self.base)

    def apply(self, spec: CaptureSpec) -> None:
        """A reloaded policy's section: new limits apply to the next write; the
        queue keeps the bound it started with."""
        if spec == self.spec:
            return
        if (spec.directory, spec.max_file_bytes, spec.max_files, spec.retention_days) != (
                self.spec.directory, self.spec.max_file_bytes, self.spec.max_files, self.spec.retention_days):
            self.files = _files(spec, self.base)
        self.spec = spec

    def offer(self, endpoint: str, body: Mapping[str, Any], traffic_class: str | None) -> None:
        """Called by the edge after routing; never blocks, never raises."""
        spec = self.spec
        if not spec.enabled or self.rng.random() >= spec.share:
            return
        if endpoint in ("chat", "completions"):
            prompt = body.get("messages") if endpoint == "chat" else body.get("prompt")
        else:  # Messages and Responses are kept as the chat turns they read as
            prompt = apis.conversation(endpoint, body)
        size = _size(prompt, spec.max_prompt_bytes)
        if size > spec.max_prompt_bytes:
            self.metrics.capture_dropped.labels("too_large").inc()
            return
        if self.queued_bytes + size > spec.queue_bytes:
            self.metrics.capture_dropped.labels("queue_full").inc()
            return
        try:
            self.queue.put_nowait((time.time(), endpoint, traffic_class, prompt, size))
        except asyncio.QueueFull:
            self.metrics.capture_dropped.labels("queue_full").inc()
            return
        self.queued_bytes += size
        self.metrics.capture_sampled.inc()

    async def prepare(self) -> None:
        """Build the scrubber for the section in force, in a worker thread, if capture
        is on and it is not built yet. Without the scrubbing libraries nothing is written."""
        spec = self.spec
        if not spec.enabled or not self._stale(spec.phone_region):
            return
        try:
            self.scrubber = await asyncio.to_thread(_built, spec.phone_region)
        except ImportError as exc:
            self.log.warning("capture_scrubber_failed", error=type(exc).__name__, missing=exc.name,
                             hint="pip install 'specgate[capture]'")
        except Exception as exc:
            self.log.warning("capture_scrubber_failed", error=type(exc).__name__)

    async def run(self) -> None:
        """The background task: until cancelled, scrub and write what is offered."""
        while True:
            try:
                batch = [await asyncio.wait_for(self.queue.get(), PRUNE_EVERY_S)]
            except TimeoutError:
                await self._prune()
                continue
            while len(batch) < BATCH and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            self.queued_bytes -= sum(offered[4] for offered in batch)
            await self.prepare()  # a reload turned capture on or changed the region
            files, spec = self.files, self.spec
            if files is None:
                continue
            scrubber = self.scrubber
            if scrubber is None or scrubber.phone_region != spec.phone_region:  # its build failed: logged
                self.metrics.capture_dropped.labels("error").inc(len(batch))
                continue
            try:
                written, counts = await asyncio.to_thread(self._write, batch, files, scrubber)
            except Exception as exc:  # a full disk or a broken scrubber must not end capture
                self.metrics.capture_dropped.labels("error").inc(len(batch))
                self.log.warning("capture_write_failed", records=len(batch), error=type(exc).__name__)
                continue
            self.metrics.capture_written.inc(written)
            self.metrics.capture_dropped.labels("no_text").inc(len(batch) - written)
            for placeholder, count in counts.items():
                self.metrics.capture_redactions.labels(placeholder.strip("<>").lower()).inc(count)

    async def _prune(self) -> None:
        if self.files is not None:
            try:
                await asyncio.to_thread(self.files.prune)
            except OSError as exc:
                self.log.warning("capture_prune_failed", error=type(exc).__name__)

    def _stale(self, region: str) -> bool:
        return self.scrubber is None or self.scrubber.phone_region != region

    def _write(self, batch: list[Offered], files: CaptureFiles, scrubber: Scrubber) -> tuple[int, dict[str, int]]:
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
        if lines:
            files.append(lines)
        return len(lines), counts


def _built(region: str) -> Scrubber:
    """A scrubber, then everything alive frozen out of the collector's generations
    (after one collection, so that no garbage is frozen with it)."""
    scrubber = Scrubber(region)
    gc.collect()
    gc.freeze()
    return scrubber


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


def _size(prompt: Any, limit: int) -> int:
    """The prompt's text length, counted until it passes `limit` (then any larger number does)."""
    if isinstance(prompt, str):
        return len(prompt)
    total = 0
    for message in prompt if isinstance(prompt, list) else ():
        content = message.get("content") if isinstance(message, Mapping) else None
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.get("text") if isinstance(part, Mapping) else part
            total += len(text) if isinstance(text, str) else 0
        if total > limit:
            break
    return total


def _files(spec: CaptureSpec, base: Path) -> CaptureFiles | None:
    if spec.directory is None:
        return None
    return CaptureFiles(base / spec.directory, spec.max_file_bytes, spec.max_files, spec.retention_days)
