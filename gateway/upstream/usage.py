"""The usage plan: for each API, what the gateway asks of a pool so it can
count an answer's output tokens, how it reads the count, and what it takes
out again before the client sees it. Every other module asks this one.

    endpoint      asked of the pool                        read from                   removed
    chat,         stream_options.include_usage, when the   the usage chunk's           the usage-only chunk and
    completions   client streams one choice without it;    completion_tokens           the "usage":null marks
                  continuous_usage_stats on a paced pool                               (unless the client asked);
                                                                                       running counts (the pacer)
    messages      nothing: message_start and message_delta message_delta's             nothing
                  always carry usage                       output_tokens
    responses     nothing: response.completed carries it   response.completed's        nothing
                                                           output_tokens (and the id)

A plan also knows the two stream facts that differ by API: which event marks
generated output (the meter's first token and event count), and how the
stream ends and reports a failure (an OpenAI `data:` error and `[DONE]`;
Anthropic's and Responses' `event: error`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.errors import GatewayError

EVENT_END = re.compile(rb"\r?\n\r?\n")
DONE = b"data: [DONE]"
# how an OpenAI stream ends, with or without the space after "data:"
OPENAI_LAST_EVENTS = (DONE + b"\n\n", DONE + b"\r\n\r\n", b"data:[DONE]\n\n", b"data:[DONE]\r\n\r\n")
COMPLETION_TOKENS = b'"completion_tokens"'
OUTPUT_TOKENS = b'"output_tokens"'
COUNT = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*([0-9]+)')
# Matched with any whitespace a backend puts around JSON separators, in any key order:
FINISH = re.compile(rb'"finish_reason"\s*:\s*"')  # a choice's last chunk: its finish_reason is a string
# FINISH searched for from its rarest byte (`finish_at`): the regex engine scans for a pattern's
# first byte, and `"` opens every key and string of a chunk, where `_` is in a few keys only
FINISH_TAIL = re.compile(rb'_reason"\s*:\s*"')
FINISH_HEAD = b'"finish'
USAGE = re.compile(rb'"usage"\s*:\s*\{')  # a usage block (not a "usage":null mark)
NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')  # with it: the chunk include_usage adds at the end
USAGE_NULL = b',"usage":null'  # some servers mark every chunk so once usage is asked for
FINGERPRINT = re.compile(rb',"system_fingerprint":"[^"]*"')
# a Responses event's response object opens with its id (vLLM: `resp_<uuid>`, or the body's `request_id`)
RESPONSE_ID = re.compile(rb'"response"\s*:\s*\{\s*"id"\s*:\s*"([^"\\]{1,256})"')
# what marks an event of generated output, per API: its first is the first token
OUTPUT_MARKS = {"messages": b"event: content_block_delta", "responses": b"event: response.output_text.delta"}


def count_of(data: bytes, key: bytes = COMPLETION_TOKENS) -> int | None:
    """The last `key` count in `data` (a usage block follows the content), or
    None. A quote inside a JSON string is escaped, so the key cannot be
    matched inside generated text."""
    at = data.rfind(key)
    if at < 0:
        return None
    found = COUNT.match(data, at)
    return int(found.group(1)) if found else None


def finish_at(events: bytes) -> int:
    """Where FINISH first matches in `events`, or -1. Its tail is searched for, then the bytes
    before it: served, a stream's 2.9 KB run cost 31k instructions searched from the `"`, 25k
    from the `_`."""
    found = FINISH_TAIL.search(events)
    while found is not None:
        at = found.start() - len(FINISH_HEAD)
        if at >= 0 and events[at:found.start()] == FINISH_HEAD:
            return at
        found = FINISH_TAIL.search(events, found.start() + 1)  # another key's `_reason` (stop_reason)
    return -1


def done_events(data: bytes) -> int:
    """How many `data: [DONE]` events `data` holds, as any backend writes them: with no space
    after `data:`, or spaces and tabs. Found by `bytes.find`, then read by index: a regex's
    `findall` reads every byte of a long last chunk in the regex engine."""
    count, at = 0, data.find(b"[DONE]")
    while at >= 0:
        start = at
        while start > 0 and data[start - 1] in b" \t":
            start -= 1
        if data.endswith(b"data:", 0, start):
            count += 1
        at = data.find(b"[DONE]", at + 6)
    return count


def completion_tokens(data: bytes) -> int | None:
    """The last `completion_tokens` count in `data`, or None."""
    return count_of(data, COMPLETION_TOKENS)


def usage_hidden(body: Mapping[str, Any], stream: bool, choices: int) -> bool:
    """Whether the gateway must ask the pool for a usage chunk the client did
    not ask for: a stream of one choice with no `stream_options.include_usage`.
    Options the pool would refuse are left for it to refuse."""
    options = body.get("stream_options")
    return stream and choices == 1 and (options is None or (isinstance(options, dict)
                                                           and not options.get("include_usage")))


def ask_token_counts(options: Any) -> dict[str, Any]:
    """The request changes that make a pool send a running token count in each
    chunk, on top of `options` (the stream_options about to be sent); none
    for options the pool would refuse anyway."""
    if options is not None and not isinstance(options, dict):
        return {}
    return {"stream_options": {**(options or {}), "include_usage": True, "continuous_usage_stats": True}}


def client_counts(body: Mapping[str, Any] | None) -> bool:
    """Whether the client asked for the running count itself (then its chunks keep it)."""
    options = (body or {}).get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage")) \
        and bool(options.get("continuous_usage_stats"))


class UsagePlan:
    """One request's plan (see the module doc)."""

    def __init__(self, endpoint: str, body: Mapping[str, Any] | None = None, stream: bool = False,
                 choices: int = 1) -> None:
        self.endpoint = endpoint
        self.openai = endpoint not in OUTPUT_MARKS
        self.hidden = self.openai and body is not None and usage_hidden(body, stream, choices)
        self.keep_counts = client_counts(body)  # a paced stream keeps its running counts
        self.mark = OUTPUT_MARKS.get(endpoint, b"data:")

    def asks(self, body: Mapping[str, Any], paced: bool) -> dict[str, Any]:
        """The changes to the request body that this plan asks of the pool."""
        changes: dict[str, Any] = {}
        if self.hidden:
            # the usage of every chunk (continuous_usage_stats) would show: only the last chunk's is asked
            options = {k: v for k, v in (body.get("stream_options") or {}).items()
                       if k != "continuous_usage_stats"}
            changes["stream_options"] = {**options, "include_usage": True}
        if paced and self.openai:  # a paced stream needs each chunk's token count
            changes.update(ask_token_counts(changes.get("stream_options", body.get("stream_options"))))
        return changes

    def tap(self) -> UsageTap:
        return UsageTap(self.hidden, COMPLETION_TOKENS if self.openai else OUTPUT_TOKENS,
                        responses=self.endpoint == "responses")

    def body_tokens(self, content: bytes) -> int | None:
        """A whole answer's output tokens, from its usage block."""
        return count_of(content, COMPLETION_TOKENS if self.openai else OUTPUT_TOKENS)

    def ended(self, events: bytes) -> bool:
        """Whether `events` end the stream: after them the client has the whole answer."""
        if self.endpoint == "messages":
            return b"event: message_stop" in events
        if self.endpoint == "responses":
            return b"event: response.completed" in events
        return events.endswith(OPENAI_LAST_EVENTS)

    def stream_error(self, error: GatewayError) -> bytes:
        """The event that reports `error` to a client whose stream broke."""
        if self.endpoint == "messages":
            return b"event: error\ndata: " + json.dumps(error.answer("messages")[1]).encode() + b"\n\n"
        if self.endpoint == "responses":
            event = {"type": "error", "code": error.code or error.error_type, "message": error.message,
                     "param": error.param}
            return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
        return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


def response_id(content: bytes) -> str | None:
    """The id of a whole Responses answer, or None."""
    try:
        answer = json.loads(content)
    except ValueError:
        return None
    found = answer.get("id") if isinstance(answer, dict) else None
    return found if isinstance(found, str) and found else None


class UsageTap:
    """Reads the output token count off whole SSE events as the relay passes
    them on. `hidden`: the gateway asked for the usage chunk, so the client
    must not see it: the usage-only chunk is dropped, `"usage":null` marks
    are cut (looked for only when the first events had one), and the
    `system_fingerprint` vLLM moves from a choice's last chunk to the usage
    chunk goes back. For that, the events from the last chunk on wait for the
    usage chunk (sent right after it) or for the end of the stream; every
    other event passes at once and untouched. One choice only (n=1): the
    gateway does not ask for usage otherwise. Per run of events: one search
    when hidden, none when not for OpenAI's APIs (the usage the client asked
    for is read once, from the last runs, at the end), one for Messages and
    Responses (their counts come in separate events)."""

    def __init__(self, hidden: bool, key: bytes = COMPLETION_TOKENS, responses: bool = False) -> None:
        self.hidden = hidden
        self.key = key
        self.held = b""
        self.marks: bool | None = None  # whether the pool marks chunks "usage":null
        self.response_id: str | None = None  # a Responses answer's id, once seen
        self._responses = responses
        self._tokens: int | None = None
        self._before = self._last = b""  # the last two runs of events, when the client asked for usage

    def feed(self, events: bytes) -> bytes:
        """What goes to the client for `events`, a run of whole events."""
        if self.key != COMPLETION_TOKENS:
            return self._read(events)
        if not self.hidden:
            if events:
                self._before, self._last = self._last, events
            return events
        if self.marks is None:
            self.marks = USAGE_NULL in events
        if self.marks:
            events = events.replace(USAGE_NULL, b"")
        if self.held:
            out, self.held = b"", self.held + events
        else:
            finish = finish_at(events)
            if finish < 0:
                return events
            start = events.rfind(b"data:", 0, finish)
            out, self.held = events[:start], events[start:]
        return out + self._release()

    def flush(self) -> bytes:
        """Whatever is held: the stream ended or broke."""
        held, self.held = self.held, b""
        return held

    def tokens(self) -> int | None:
        """The usage's output token count, or None when none went by."""
        if self.hidden or self.key != COMPLETION_TOKENS:
            return self._tokens
        found = completion_tokens(self._last)
        return completion_tokens(self._before) if found is None else found

    def _read(self, events: bytes) -> bytes:
        """Messages and Responses: the last count and the response's id, read as the events pass."""
        found = count_of(events, self.key)
        if found is not None:
            self._tokens = found
        if self._responses and self.response_id is None:
            opening = RESPONSE_ID.search(events)
            self.response_id = None if opening is None else opening.group(1).decode()
        return events

    def _release(self) -> bytes:
        held = self.held
        found = _usage_only(held)
        if found is None:
            return self.flush() if done_events(held) else b""
        start, stop = found
        chunk, last, rest = held[start:stop], held[:start], held[stop:]
        self._tokens = completion_tokens(chunk)
        fingerprint = FINGERPRINT.search(chunk)
        if fingerprint is not None and last and b'"system_fingerprint"' not in last:
            close = last.rfind(b"}")
            last = last[:close] + fingerprint.group() + last[close:]
        self.held = b""
        return last + rest


def _usage_only(events: bytes) -> tuple[int, int] | None:
    """Where the usage-only chunk (a usage block, no choices) is in `events`;
    chunks that carry a usage block beside their choices are passed over."""
    for usage in USAGE.finditer(events):
        start = events.rfind(b"data:", 0, usage.start())
        end = EVENT_END.search(events, usage.start())
        stop = len(events) if end is None else end.end()
        if NO_CHOICES.search(events, start, stop) is not None:
            return start, stop
    return None
