"""Picking an endpoint of a pool: `LeastOutstanding` and `PrefixAffinity`.

`LeastOutstanding` draws two endpoints by weight and takes the one with less
load per weight. `PrefixAffinity` keeps a prompt's prefix, and a session,
on the endpoint that served it: consistent hashing with bounded loads
(Mirrokni, Thorup and Zadimoghaddam, 2018). An endpoint takes a request
while its load after it is at most ceil(load_factor x (the pool's load after
it) x its share of the weights): the pool's load is over its available
endpoints, each one's this gateway's requests in flight plus the other
replicas' as last published. In order:

1. the session's endpoint (header or `user`), when it is available and within the bound;
2. the endpoint that served the longest leading run of the prompt's blocks,
   then the next longest, while within the bound;
3. no block matched: weighted rendezvous hashing of the session key, else of
   the first block, over the endpoints within the bound (every gateway and
   worker computes the same choice, sharing nothing);
4. else the least loaded by weight.

The chosen endpoint is then recorded for every block and the session. An
ejected or unhealthy endpoint is simply not a candidate: its prefixes go to
others and are recorded there.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from gateway.policy.balance import AffinitySpec
from gateway.upstream.prefix_map import LruMap
from gateway.upstream.prompt_key import PromptKey, digest

Elsewhere = Callable[[], Mapping[str, int]]  # url -> the other replicas' requests in flight
_MASK = (1 << 64) - 1


class Target(Protocol):
    url: str
    weight: float
    outstanding: int


E = TypeVar("E", bound=Target)


class Choice(Generic[E]):
    """The endpoint picked and why; `explain` shows it. A plain class: one is built per
    request, and a compiled module leaves a dataclass's `__init__` interpreted."""
    __slots__ = ("endpoint", "reason", "load", "bound", "matched", "blocks", "session", "session_hit")

    def __init__(self, endpoint: E, reason: str, load: int = 0, bound: int | None = None, matched: int = 0,
                 blocks: tuple[int, ...] = (), session: int | None = None, session_hit: bool | None = None) -> None:
        self.endpoint = endpoint
        self.reason = reason  # only | two_choices | session | prefix | hash | least_loaded
        self.load = load  # the endpoint's load before this request
        self.bound = bound  # the most load it may have after it; None: no bound applied
        self.matched = matched  # leading prompt blocks the endpoint served last
        self.blocks = blocks
        self.session = session
        self.session_hit = session_hit  # None: no session key

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint.url, "reason": self.reason, "load": self.load, "bound": self.bound,
                "matched_blocks": self.matched, "prompt_blocks": len(self.blocks),
                "session": None if self.session_hit is None else ("hit" if self.session_hit else "mapped")}


class LeastOutstanding(Generic[E]):
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, candidates: Sequence[E], key: PromptKey | None, elsewhere: Elsewhere) -> Choice[E]:
        if len(candidates) == 1:
            return Choice(candidates[0], "only", candidates[0].outstanding)
        a, b = self.rng.choices(candidates, weights=[e.weight for e in candidates], k=2)
        counts = elsewhere()
        load_a = a.outstanding + counts.get(a.url, 0)
        load_b = b.outstanding + counts.get(b.url, 0)
        if (load_a + 1) / a.weight <= (load_b + 1) / b.weight:
            return Choice(a, "two_choices", load_a)
        return Choice(b, "two_choices", load_b)

    def record(self, choice: Choice[E]) -> None:
        """Nothing to remember."""


class Loads(Generic[E]):
    """The candidates' loads and the bound each may reach."""

    def __init__(self, candidates: Sequence[E], counts: Mapping[str, int], factor: float) -> None:
        self.of = {e: e.outstanding + counts.get(e.url, 0) for e in candidates}
        self.scale = factor * (sum(self.of.values()) + 1) / sum(e.weight for e in candidates)

    def bound(self, endpoint: E) -> int:
        return math.ceil(self.scale * endpoint.weight - 1e-9)

    def fits(self, endpoint: E) -> bool:
        return self.of[endpoint] + 1 <= self.bound(endpoint)

    def least(self, rank: Callable[[E], float]) -> E:
        """The least loaded for its weight; a tie goes to the highest `rank`, not
        to the endpoint listed first (ties are common at light load)."""
        return min(self.of, key=lambda e: ((self.of[e] + 1) / e.weight, -rank(e)))


class PrefixAffinity(Generic[E]):
    def __init__(self, spec: AffinitySpec, rng: random.Random) -> None:
        self.spec = spec
        self.prefixes: LruMap[E] = LruMap(spec.max_blocks)
        self.sessions: LruMap[E] = LruMap(spec.max_blocks)
        self.rng = rng
        self.keyless: LeastOutstanding[E] = LeastOutstanding(rng)  # a request with no prompt to hash (passthrough)
        self._ids: dict[str, int] = {}  # url -> its 64-bit hash, for rendezvous

    def pick(self, candidates: Sequence[E], key: PromptKey | None, elsewhere: Elsewhere) -> Choice[E]:
        if key is None:
            return self.keyless.pick(candidates, key, elsewhere)
        spec = self.spec
        prompt = key.blocks(spec.block_chars)
        blocks = prompt.hashes
        session = key.session(spec.session_header)
        loads: Loads[E] = Loads(candidates, elsewhere(), spec.load_factor)

        def chose(endpoint: E, reason: str, matched: int = 0) -> Choice[E]:
            hit = None if session is None else reason == "session"
            return Choice(endpoint, reason, loads.of[endpoint], loads.bound(endpoint), matched, blocks, session, hit)

        if session is not None:
            owner = self.sessions.get(session)
            if owner is not None and owner in loads.of and loads.fits(owner):
                return chose(owner, "session")
        matches = self.prefixes.matches(blocks, loads.of)
        for endpoint, matched in sorted(matches.items(), key=lambda item: -item[1]):
            if loads.fits(endpoint):
                return chose(endpoint, "prefix", matched)
        seed = session if session is not None else prompt.anchor
        if not matches and seed is not None:
            fitting = [e for e in candidates if loads.fits(e)]
            if fitting:
                return chose(max(fitting, key=lambda e: self._score(seed, e)), "hash")
        least = loads.least((lambda e: self._score(seed, e)) if seed is not None else (lambda e: self.rng.random()))
        return chose(least, "least_loaded", matches.get(least, 0))

    def record(self, choice: Choice[E]) -> None:
        """The chosen endpoint now holds the request's blocks and its session."""
        if choice.blocks:
            self.prefixes.record(choice.blocks, choice.endpoint)
        if choice.session is not None:
            self.sessions.record((choice.session,), choice.endpoint)

    def _score(self, seed: int, endpoint: E) -> float:
        """Weighted rendezvous: weight / -ln(u), u uniform in (0, 1) from (seed, endpoint)."""
        ident = self._ids.get(endpoint.url)
        if ident is None:
            ident = self._ids[endpoint.url] = digest(endpoint.url.encode())
        u = ((_mix(seed ^ ident) >> 11) + 0.5) / (1 << 53)
        return endpoint.weight / -math.log(u)


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well spread 64-bit value from any 64-bit value."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


Balancer = LeastOutstanding[E] | PrefixAffinity[E]
