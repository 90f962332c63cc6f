"""Property test of the raw HTTP surface: random methods, paths, header bytes,
`Expect`, duplicated Content-Length, Transfer-Encoding variants and pipelined
requests, on raw sockets to a real gateway in front of two fake vLLM servers.

After every example: no answer is a 500, every connection answers or closes
before the read deadline (an event bound: the pool's total time plus the body
timeout plus a margin, reported as a hang), no answer carries another
request's marker (each request sends a unique x-request-id, the fakes echo it
as x-fake-request-id), and the pools' in-flight counts (Pool.in_flight, every
Endpoint.outstanding) are back where the example found them: zero, unless an
earlier example leaked, which that example reports.

`--hypothesis-show-statistics` shows what answered: the gateway's own errors
by code, or a backend.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from backends.serving.server import BackgroundServer
from gateway.edge.app import create_app
from gateway.settings import Settings
from gateway.upstream.runtime import Runtime
from tests.fakes.vllm import FakeVllm

from .conftest import policy_dict
from .raw_http import Answer, Hang, RawConnection, leases_outstanding, wait_for

TOTAL_S = 2.0
BODY_TIMEOUT_S = 1.0
DEADLINE_S = TOTAL_S + BODY_TIMEOUT_S + 5.0  # no answer may take longer than this
# No exchange outlives its total time, so a lease still out long after that is leaked;
# the wait is an event bound (generous for a loaded machine), not a timing assertion.
SETTLE_S = 30.0


@dataclass
class Surface:
    url: str
    runtime: Runtime
    markers: Iterator[int]


@pytest.fixture(scope="module")
def surface(tmp_path_factory) -> Iterator[Surface]:
    path: Path = tmp_path_factory.mktemp("fuzz-http") / "policy.yaml"
    with FakeVllm(model="upstream-spec") as spec, FakeVllm(model="upstream-std", kind="standard") as std:
        spec.script(text="ok", chunks=1)
        std.script(text="ok", chunks=1)
        policy = policy_dict([spec.url], [std.url])
        for pool in policy["pools"].values():
            pool["timeouts"] = {"connect_s": 1, "first_byte_s": TOTAL_S, "total_s": TOTAL_S}
        path.write_text(yaml.safe_dump(policy))
        app = create_app(Settings(policy=path, body_timeout_s=BODY_TIMEOUT_S))
        server = BackgroundServer(app, lifespan="on").start()
        try:
            yield Surface(server.url, app.state.runtime, itertools.count())
        finally:
            server.stop(graceful=True)


# -- requests ----------------------------------------------------------------

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
COMPLETION = {"model": "m", "prompt": "hi", "max_tokens": 40}
GENERATE = [(b"/v1/chat/completions", json.dumps(body).encode()) for body in (CHAT, {**CHAT, "stream": True})] + [
    (b"/v1/completions", json.dumps(body).encode()) for body in (COMPLETION, {**COMPLETION, "stream": True})]
BODIES = [b"", b"{not json", *(body for _, body in GENERATE)]
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/files", "/healthz", "/readyz",
          "/metrics", "/admin/flags", "/"]
SEGMENTS = ["v1", "chat", "completions", "models", "metrics", "health", "debug", "..", ".", "%2e%2e", "%2E",
            "%2f", "%2F", "%5c", "%5C", "%25", "%00", "%0a", "%41", "%c3%a9", "%ff", "%", "a;b", "~x", ""]
# Framing headers come only from `framed`, so the body sent is always the body declared.
RESERVED = {b"content-length", b"transfer-encoding", b"x-request-id"}
HEADER_NAMES = [b"expect", b"connection", b"host", b"upgrade", b"te", b"keep-alive", b"x-specgate-route",
                b"x-specgate-domain", b"authorization", b"content-type", b"accept", b"trailer", b"x-a"]
TRANSFER_CODINGS = [b"chunked", b"Chunked", b" chunked", b"chunked\t", b"gzip, chunked", b"chunked, gzip",
                    b"identity", b"chunked;x=1", b"chunked, chunked"]

token = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~", min_size=1, max_size=12).map(str.encode)
any_bytes = st.binary(min_size=1, max_size=12).filter(lambda b: not any(c in b for c in b" \r\n:"))
header_name = (st.sampled_from(HEADER_NAMES) | token).filter(lambda name: name.lower() not in RESERVED)
# what llhttp takes in a header value: tab, visible ASCII, obs-text (0x80-0xff)
printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.encode)
header_value = printable | st.lists(st.integers(0x20, 0x7E) | st.integers(0x80, 0xFF) | st.just(0x09),
                                    max_size=40).map(bytes)
no_crlf = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
method = st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"PATCH", b"OPTIONS"])
fuzzed_path = st.one_of(
    st.sampled_from(ROUTES).map(str.encode),
    st.lists(st.sampled_from(SEGMENTS), max_size=5).map(lambda s: ("/v1/" + "/".join(s)).encode()),
    st.lists(st.integers(0, 255), max_size=6).map(lambda bs: b"/v1/x" + b"".join(b"%%%02x" % b for b in bs)),
    st.sampled_from([8000, 9000, 20000]).map(lambda n: b"/v1/" + b"a" * n),
)
query = st.sampled_from([b"", b"", b"", b"?a=1", b"?x=%2F.."])
# Malformed on purpose, one part of a request at a time: most requests stay parseable.
BROKEN = ["nothing"] * 6 + ["method", "header", "target", "framing"]


@st.composite
def framed(draw: st.DrawFn, body: bytes, broken: bool) -> tuple[list[bytes], bytes]:
    """Framing headers and the body as sent, always consistent with each other."""
    kinds = ["length twice", "lengths differ", "chunked and length"] if broken else ["length"] * 4 + [
        "chunked", "none"]
    kind = draw(st.sampled_from(kinds))
    length = b"content-length: %d" % len(body)
    if kind == "length":
        return [length], body
    if kind == "length twice":
        return [length, length], body
    if kind == "lengths differ":
        return [length, b"content-length: %d" % (len(body) + 1)], body
    if kind == "none":
        return [], b""
    coding = draw(st.sampled_from(TRANSFER_CODINGS))
    chunked = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    extra = [length] if kind == "chunked and length" else []
    return [b"transfer-encoding: " + coding, *extra], chunked


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(method, request bytes with a {marker} to fill in)."""
    broken = draw(st.sampled_from(BROKEN))
    if draw(st.booleans()):  # what nearly all traffic is: a completion request
        verb, (target, body) = b"POST", draw(st.sampled_from(GENERATE))
    else:
        verb = draw(method)
        target = draw(fuzzed_path) + draw(query)
        body = draw(st.sampled_from(BODIES) if verb != b"HEAD" else st.just(b""))
    if broken == "method":
        verb = draw(token.map(bytes.upper) | any_bytes)
    if broken == "target":
        target = draw(st.binary(max_size=20).map(lambda b: b"/v1/" + bytes(c for c in b if c not in b" \r\n"))
                      | st.sampled_from([b"/v1/x?\x01", b"/v1/x?\xff", b"*", b"v1/models", b"http://evil/v1/x"]))
    headers = draw(st.lists(st.tuples(header_name, header_value), max_size=3))
    if broken == "header":
        headers.append(draw(st.tuples(any_bytes, no_crlf) | st.tuples(header_name, no_crlf)))
    if draw(st.integers(0, 3)) == 0:
        headers.append((b"expect", draw(st.sampled_from([b"100-continue", b"100-Continue", b"nonsense"]))))
    framing, body = draw(framed(body, broken == "framing"))
    lines = [b"host: gateway", *(name + b": " + value for name, value in headers), *framing]
    return verb, verb + b" " + target + b" HTTP/1.1\r\nx-request-id: {marker}\r\n" + b"\r\n".join(lines) \
        + b"\r\n\r\n" + body


connections = st.lists(st.lists(requests(), min_size=1, max_size=3), min_size=1, max_size=2)


# -- invariants ----------------------------------------------------------------

ANSWER_ID = re.compile(rb'"id": ?"(?:chatcmpl|cmpl)-([^"]*)"')  # the fakes build ids from x-request-id


def run_connection(surface: Surface, templates: list[tuple[bytes, bytes]]) -> tuple[list[str], list[str]]:
    """Send the requests pipelined on one connection: (problems seen, what answered)."""
    markers = [f"fz{next(surface.markers)}" for _ in templates]
    problems, seen = [], []
    with RawConnection(surface.url, DEADLINE_S) as connection:
        pairs = zip(templates, markers, strict=True)
        connection.send(b"".join(template.replace(b"{marker}", m.encode()) for (_, template), m in pairs))
        for (verb, _), marker in zip(templates, markers, strict=True):
            try:
                answer = connection.answer(verb.decode("latin-1"))
            except Hang as exc:
                return [f"{marker}: {exc}"], seen
            if answer is None:  # the gateway refused the connection's rest and closed it: allowed
                break
            seen.append(label(answer))
            problems += check(answer, marker)
    return problems, seen


def label(answer: Answer) -> str:
    """What kind of answer this was, for the statistics (--hypothesis-show-statistics)."""
    if answer.values("x-fake-request-id"):
        return f"{answer.status} from a backend"
    try:
        error = answer.json()["error"]
        return f"{answer.status} from the gateway: {error['code'] or error['type']}"
    except (ValueError, KeyError, TypeError):
        return f"{answer.status} from the gateway"


def check(answer: Answer, marker: str) -> list[str]:
    problems = []
    if answer.status == 500:
        problems.append(f"{marker}: 500 {answer.body[:200]!r}")
    for name in ("x-request-id", "x-fake-request-id"):
        strangers = [v for v in answer.values(name) if v != marker]
        if strangers:
            problems.append(f"{marker}: answered with {name} {strangers}, another request's answer")
    strangers = {found.decode() for found in ANSWER_ID.findall(answer.body)} - {marker}
    if strangers:
        problems.append(f"{marker}: the body answers {sorted(strangers)}, another request")
    return problems


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plan=connections)
def test_raw_http_surface(surface, plan):
    with ThreadPoolExecutor(len(plan)) as pool:
        results = list(pool.map(lambda c: run_connection(surface, c), plan))
    problems = [problem for found, _ in results for problem in found]
    for _, seen in results:
        for kind in seen:
            event(kind)
    # only this test sends to this gateway: once every answer is in, nothing may stay leased
    if not wait_for(lambda: not leases_outstanding(surface.runtime), SETTLE_S):
        problems.append(f"pool accounting {leases_outstanding(surface.runtime)} after every answer")
    assert not problems, problems
