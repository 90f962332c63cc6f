"""Pacing a pool's streamed bursts into an even cadence.

A speculative engine sends the tokens one step accepted in one event, so a
stream arrives in bursts. For a pool whose policy turns `pacing` on, the
request's usage plan asks it for a running token count in every chunk
(`stream_options.continuous_usage_stats`, usage.py), and `Pacer` splits a chunk of k > 1 tokens into k
chunks of one piece each, spaced at the stream's own recent time per token
(an EWMA of the gap between events over an EWMA of their tokens). The split text follows the logprobs' tokens when
the chunk has them, else it is cut into k nearly equal pieces between
characters. No piece waits more than `max_delay_s` past its chunk's arrival,
the first piece of a burst after a gap longer than that goes at once, and
everything else (role, finish, usage, [DONE], errors, events it does not
read) flushes what is held and goes at once, in order. The running count the
client did not ask for is taken out again.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gateway.upstream.usage import EVENT_END, completion_tokens

ALPHA = 0.3  # weight of the newest run in the averages of gap and tokens
EARLY_S = 0.0005  # a piece this close to its time goes now rather than after another timer


def split_text(text: str, parts: int) -> list[str]:
    """`text` in `parts` nearly equal pieces between characters (fewer for a shorter text)."""
    parts = max(1, min(parts, len(text)))
    bounds = [round(i * len(text) / parts) for i in range(parts + 1)]
    return [text[bounds[i]:bounds[i + 1]] for i in range(parts)]


class Pacer:
    """Paces the runs of whole events one streamed answer relays (see the module doc)."""

    def __init__(self, max_delay_s: float, keep_counts: bool = False) -> None:
        self.max_delay_s = max_delay_s
        self.keep_counts = keep_counts
        self.per_token: float | None = None  # the stream's recent seconds per token: average gap / tokens
        self.gap_s: float | None = None  # the average gap between runs with tokens (an EWMA)
        self.tokens: float | None = None  # the average tokens such a run brings (an EWMA)
        self.counted = 0  # the running token count of the last chunk that had one
        self.last_run: float | None = None  # when the last run with tokens arrived
        self.last_due: float | None = None
        self.held: deque[tuple[float, bytes]] = deque()

    async def pace(self, runs: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        """`runs` as they should go out: each yield is due now. Reads ahead in
        one task while pieces wait; closing or cancelling this ends that task."""
        loop = asyncio.get_running_loop()
        read: asyncio.Task[bytes | None] | None = None
        try:
            while True:
                if read is None:
                    read = asyncio.ensure_future(anext(runs, None))
                await asyncio.wait({read}, timeout=self.due_in(loop.time()))
                if read.done():
                    done, read = read, None
                    try:
                        run = done.result()
                    except BaseException:
                        if self.held:
                            yield self.release(None)  # what arrived before the break goes first
                        raise
                    if run is None:
                        break
                    self.feed(run, loop.time())
                if out := self.release(loop.time()):
                    yield out
            if self.held:
                yield self.release(None)
        finally:
            if read is not None:
                await _drop(read)

    def due_in(self, now: float) -> float | None:
        """Seconds until the next held piece is due; None when nothing is held."""
        return max(0.0, self.held[0][0] - now) if self.held else None

    def release(self, now: float | None) -> bytes:
        """The held pieces due by `now` (all of them for None), in order."""
        out = []
        while self.held and (now is None or self.held[0][0] <= now + EARLY_S):
            out.append(self.held.popleft()[1])
        return b"".join(out)

    def feed(self, run: bytes, now: float) -> None:
        """Schedule a run of whole events that arrived at `now`."""
        events = _events(run)
        split = [self._pieces(event) for event in events]
        tokens = sum(len(pieces) for paced, pieces in split if paced)
        gap = self._learn(now, tokens)
        for paced, pieces in split:
            if not paced:
                self._flush(now)
                self._hold(now, pieces[0])
                continue
            spacing = 0.0 if gap is None else min(gap, self.max_delay_s / max(1, len(pieces) - 1))
            for piece in pieces:
                due = now if self.last_due is None else max(now, self.last_due + spacing)
                self._hold(min(due, now + self.max_delay_s), piece)

    def _learn(self, now: float, tokens: int) -> float | None:
        """Feed the estimate with this run's gap / tokens; the spacing for its
        pieces, or None when they go at once (no estimate yet, or a gap past the bound)."""
        if not tokens:
            return self.per_token
        last, self.last_run = self.last_run, now
        if last is None or now - last > self.max_delay_s:
            return None
        if now > last:  # a ratio of averages: an average of gap / tokens would overrate small bursts
            self.gap_s = _ewma(self.gap_s, now - last)
            self.tokens = _ewma(self.tokens, tokens)
            self.per_token = self.gap_s / self.tokens
        return self.per_token

    def _hold(self, due: float, data: bytes) -> None:
        self.held.append((due, data))
        self.last_due = due

    def _flush(self, now: float) -> None:
        """Whatever is held is due now: an event that is not content follows it at once."""
        if self.held:
            self.held = deque((min(due, now), data) for due, data in self.held)
        self.last_due = now

    def _pieces(self, event: bytes) -> tuple[bool, list[bytes]]:
        """Whether `event` is content to pace, and what goes out for it: a content
        chunk's pieces, or the event itself (its running count taken out when
        the client did not ask for it)."""
        chunk = _chunk(event)
        if chunk is None:
            return False, [event]
        count = completion_tokens(event)
        before, tokens = self.counted, 1 if count is None else count - self.counted
        if count is not None:
            self.counted = count
        keep = self.keep_counts or "usage" not in chunk
        if not _content(chunk):
            return False, [event if keep else _encode(chunk, before, 1, 1, tokens, False)]
        pieces = _split(chunk, tokens)
        if len(pieces) == 1 and keep:
            return True, [event]
        return True, [_encode(piece, before, i + 1, len(pieces), tokens, self.keep_counts)
                      for i, piece in enumerate(pieces)]


def _ewma(average: float | None, sample: float) -> float:
    return sample if average is None else average + ALPHA * (sample - average)


def _events(run: bytes) -> list[bytes]:
    """The whole events of a run, each with its blank line."""
    events, start = [], 0
    for end in EVENT_END.finditer(run):
        events.append(run[start:end.end()])
        start = end.end()
    if start < len(run):
        events.append(run[start:])
    return events


def _chunk(event: bytes) -> dict[str, Any] | None:
    """A one-choice completion chunk sent as one `data:` line, else None."""
    if not event.startswith(b"data: {") or event.count(b"\n") > 2 + event.count(b"\r\n"):
        return None
    try:
        chunk = json.loads(event[6:])
    except ValueError:
        return None
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    return dict(chunk)


def _content(chunk: dict[str, Any]) -> str:
    """The chunk's generated text when it is plain text (no role, tool call or reasoning beside it)."""
    choice = chunk["choices"][0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        text = delta.get("content")
        plain = all(value is None for key, value in delta.items() if key != "content")
        return text if isinstance(text, str) and plain else ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def _split(chunk: dict[str, Any], tokens: int) -> list[dict[str, Any]]:
    """`chunk` as up to `tokens` chunks of one piece of its text each."""
    choice = chunk["choices"][0]
    text = _content(chunk)
    logprobs = choice.get("logprobs")
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if tokens < 2:
        return [chunk]
    if isinstance(entries, list) and len(entries) == tokens and all(isinstance(e, dict) for e in entries) \
            and "".join(str(e.get("token", "")) for e in entries) == text:
        texts = [str(e["token"]) for e in entries]
        extras: list[dict[str, Any]] = [{"logprobs": {**logprobs, "content": [e]}} for e in entries]
    elif logprobs is not None:
        return [chunk]  # logprobs that do not match the text: not split
    else:
        texts = split_text(text, tokens)
        extras = [{} for _ in texts]
    out = []
    for i, (piece, extra) in enumerate(zip(texts, extras, strict=True)):
        part = {**choice, **extra}
        if "delta" in part:
            part["delta"] = {**choice["delta"], "content": piece}
        else:
            part["text"] = piece
        if i < len(texts) - 1:
            part.update({k: None for k in ("finish_reason", "stop_reason") if k in part})
        out.append({**chunk, "choices": [part]})
    return out


def _encode(chunk: dict[str, Any], before: int, index: int, pieces: int, tokens: int, keep: bool) -> bytes:
    """One piece as an event; its running count (kept only when the client asked) at its share of the tokens."""
    usage = chunk.get("usage")
    chunk = {k: v for k, v in chunk.items() if k != "usage"}
    if keep and isinstance(usage, dict):
        done = before + round(index * tokens / pieces)
        prompt = usage.get("prompt_tokens", 0)
        chunk["usage"] = {**usage, "completion_tokens": done,
                          "total_tokens": (prompt if isinstance(prompt, int) else 0) + done}
    return b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


async def _drop(task: asyncio.Task[Any]) -> None:
    """Cancel a read-ahead task and wait for it to end, its outcome retrieved."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()
