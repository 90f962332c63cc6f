"""The capture stage: the edge offers a request, a background task scrubs and writes it.

`offer` is all the request path pays: a share draw, the prompt's length (a
walk over its strings, no copy) and a non-blocking put on a queue bounded in
prompts and in bytes; a prompt over `max_prompt_bytes` is skipped
(`too_large`), and one the queue has no room for is dropped (`queue_full`),
both counted. The task takes what is queued, has the scrubbing process
scrub it (see `scrub.Scrubber`, `worker.records`) and appends the records
(see `files.CaptureFiles`) in a worker thread, never on the event loop. A record keeps the prompt messages (role,
one of the known roles, and text, scrubbed), the traffic class, the endpoint
and the time: never names, tool arguments, the answer, headers or keys.
Logs carry counts, never prompt text.

Scrubbing runs in a process of its own (`worker.ScrubWorker`): it holds the
GIL for about 1 s on a prompt near `max_prompt_bytes`, which in this process
would stall the event loop. The stage owns that one process. `prepare` starts
it before the gateway serves (its start-up awaits it: seconds, presidio's
imports, in the child), and again when a reload turns capture on or changes
its phone region; turning capture off, or the gateway's shutdown (`close`),
ends it. A worker that dies (killed, out of memory) is counted
(`capture_worker_died`) and logged; the batch it held is dropped (`error`),
and the next batch starts another.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from gateway.capture.files import CaptureFiles
from gateway.capture.worker import Offered, ScrubberFailed, ScrubWorker, WorkerDied
from gateway.decide import apis
from gateway.metrics import GatewayMetrics
from gateway.policy.capture import CaptureSpec

BATCH = 64  # the most records one round trip to the worker scrubs
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
        self.worker: ScrubWorker | None = None  # the scrubbing process, once started
        self.spec = spec
        self.queue: asyncio.Queue[Offered] = asyncio.Queue(maxsize=spec.queue)
        self.queued_bytes = 0  # the text waiting in the queue
        self.files = _files(spec, self.base)

    def apply(self, spec: CaptureSpec) -> None:
        """A reloaded policy's section: new limits apply to the next write; the
        queue keeps the bound it started with."""
        if spec == self.spec:
            return
        if not spec.enabled:  # nothing more to scrub: its memory back
            self.close()
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
        """Start the scrubbing process for the section in force, if capture is on and none
        alive scrubs for its phone region; it returns once the process's scrubber is built.
        Without the scrubbing libraries nothing is written."""
        spec, worker = self.spec, self.worker
        if not spec.enabled or (worker is not None and worker.alive and worker.region == spec.phone_region):
            return
        if worker is not None and not worker.closed and worker.region == spec.phone_region:
            self._lost(worker, "between batches")
        self.close()
        try:
            started = await asyncio.to_thread(ScrubWorker, spec.phone_region)
        except ScrubberFailed as exc:
            missing = {"missing": exc.missing, "hint": "pip install 'specgate[capture]'"} if exc.missing else {}
            self.log.warning("capture_scrubber_failed", error=exc.error, **missing)
            return
        except Exception as exc:  # it died while building, or could not start: capture must go on
            self.log.warning("capture_scrubber_failed", error=type(exc).__name__)
            return
        if self.worker is not None or not self.spec.enabled:  # turned off meanwhile, or another one started
            started.close()
            return
        self.worker = started

    def close(self) -> None:
        """End the scrubbing process (on shutdown, or when capture is turned off)."""
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close()

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
            await self.prepare()  # a reload turned capture on or changed the region, or the worker died
            files, worker = self.files, self.worker
            if files is None:
                continue
            if worker is None or worker.region != self.spec.phone_region:  # its start failed: logged
                self.metrics.capture_dropped.labels("error").inc(len(batch))
                continue
            try:
                written, counts = await asyncio.to_thread(self._write, batch, files, worker)
            except Exception as exc:  # a full disk, a dead worker or a broken scrubber must not end capture
                self.metrics.capture_dropped.labels("error").inc(len(batch))
                if isinstance(exc, WorkerDied) and not worker.closed:
                    self._lost(worker, "scrubbing")
                else:
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

    def _lost(self, worker: ScrubWorker, during: str) -> None:
        """A worker that died by no doing of ours: counted, logged, and ended here
        (the next batch starts another)."""
        self.metrics.capture_worker_died.inc()
        self.log.warning("capture_worker_died", pid=worker.pid, during=during,
                         exitcode=worker.process.exitcode)
        if self.worker is worker:
            self.close()

    @staticmethod
    def _write(batch: list[Offered], files: CaptureFiles, worker: ScrubWorker) -> tuple[int, dict[str, int]]:
        """Blocking: the batch scrubbed in the worker process, its lines appended here."""
        lines, counts = worker.scrub(batch)
        if lines:
            files.append(lines)
        return len(lines), counts


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
