"""Prefix and session affinity with bounded load, through `Pool.acquire`."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from gateway.policy.loader import PolicyError, load_policy
from gateway.policy.pools import PoolSpec
from gateway.upstream.balance import LeastOutstanding, PrefixAffinity
from gateway.upstream.pools import Lease, Pool
from gateway.upstream.prompt_key import PromptKey

SYSTEM = {"role": "system", "content": "You answer questions about caches. " * 30}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_pool(count: int = 4, weights: tuple[float, ...] = (), elsewhere=lambda: {}, **spec) -> Pool:
    weights = weights or (1.0,) * count
    endpoints = [{"url": f"http://127.0.0.1:{9000 + i}", "weight": w} for i, w in enumerate(weights)]
    return Pool("p", PoolSpec(kind="standard", endpoints=endpoints, **spec), clock=Clock(), rng=random.Random(3),
                elsewhere=elsewhere)


def turns(conversation: int, count: int, system: dict = SYSTEM) -> list[PromptKey]:
    """The requests of one conversation: turn i carries every earlier turn."""
    messages, keys = [system], []
    for turn in range(count):
        messages = [*messages, {"role": "user", "content": f"conversation {conversation}, question {turn}"}]
        keys.append(PromptKey({"messages": list(messages)}, "chat"))
        messages = [*messages, {"role": "assistant", "content": f"answer {turn} " * 40}]
    return keys


def served(pool: Pool, key: PromptKey) -> str:
    lease = pool.acquire(key=key)
    lease.release(True)
    return lease.endpoint.url


def test_a_pool_of_several_endpoints_balances_by_prefix_and_a_single_one_does_not():
    assert isinstance(make_pool(2).balancer, PrefixAffinity)
    assert isinstance(make_pool(1).balancer, LeastOutstanding)
    assert isinstance(make_pool(2, balance="least_outstanding").balancer, LeastOutstanding)


def test_every_turn_lands_where_the_conversation_began():
    pool = make_pool(4)
    background = [pool.acquire(key=turns(100 + i, 1, {"role": "system", "content": f"other {i}"})[0])
                  for i in range(6)]  # some load held elsewhere meanwhile
    for conversation in range(30):
        keys = turns(conversation, 4, {"role": "system", "content": f"system prompt {conversation}"})
        first = served(pool, keys[0])
        assert all(served(pool, key) == first for key in keys[1:])
    for lease in background:
        lease.release(True)


def test_a_second_turn_matches_the_first_turns_blocks():
    pool = make_pool(4)
    first, second = turns(1, 2)
    lease = pool.acquire(key=first)
    assert (lease.why, lease.matched) == ("hash", 0)  # what the request's log line says
    lease.release(True)
    answer = pool.explain(second)
    assert answer["reason"] == "prefix"
    assert answer["matched_blocks"] == len(first.blocks(256).hashes)
    assert answer["prompt_blocks"] == len(second.blocks(256).hashes) > answer["matched_blocks"]
    assert answer["balance"] == "prefix" and answer["session"] is None
    lease = pool.acquire(key=second)
    assert (lease.why, lease.matched) == ("prefix", answer["matched_blocks"])


def test_bounded_load_holds_under_a_skewed_prefix_distribution():
    """Nine requests in ten share one conversation's prefix: the endpoint that
    holds it takes them up to the bound, and no endpoint goes past
    ceil(1.25 x the mean)."""
    pool = make_pool(4)
    rng = random.Random(11)
    hot = turns(0, 1)[0]
    leases: list[Lease] = []
    for i in range(400):
        key = hot if rng.random() < 0.9 else turns(i + 1, 1, {"role": "system", "content": f"cold {i}"})[0]
        leases.append(pool.acquire(key=key))
        loads = [e.outstanding for e in pool.endpoints]
        assert max(loads) <= math.ceil(1.25 * sum(loads) / len(loads))
    loads = [e.outstanding for e in pool.endpoints]
    assert max(loads) / (sum(loads) / len(loads)) <= 1.25
    holder = Counter(lease.endpoint.url for lease in leases).most_common(1)[0]
    assert holder[1] == max(loads)  # the hot prefix's endpoint is filled to the bound


def test_when_the_holder_is_over_its_bound_ties_do_not_favour_the_first_endpoint():
    """Different hot prompts each fill their holder; the overflow of each goes to
    the least loaded, and among equally loaded endpoints not always the one
    listed first."""
    overflow: Counter[str] = Counter()
    for conversation in range(40):
        pool = make_pool(4)
        hot = turns(conversation, 1, {"role": "system", "content": f"hot prompt {conversation}"})[0]
        holder = pool.acquire(key=hot)  # the others are idle: the next one is over the bound
        spill = pool.acquire(key=hot)
        assert spill.endpoint is not holder.endpoint
        overflow[spill.endpoint.url] += 1
    assert len(overflow) >= 3


def test_the_bound_follows_the_weights_and_the_other_replicas_load():
    elsewhere: dict[str, int] = {}  # url -> the other gateways' requests in flight
    pool = make_pool(2, weights=(1.0, 3.0), elsewhere=lambda: elsewhere)
    hot = turns(0, 1)[0]
    leases = [pool.acquire(key=hot) for _ in range(200)]
    light, heavy = (e.outstanding for e in pool.endpoints)
    assert light <= math.ceil(1.25 * 200 * 0.25) and heavy <= math.ceil(1.25 * 200 * 0.75)
    for lease in leases:
        lease.release(True)
    home = pool.acquire(key=hot)
    home.release(True)
    elsewhere[home.endpoint.url] = 50  # other gateways load it
    assert pool.explain(hot)["endpoint"] != home.endpoint.url


def test_an_ejected_endpoint_gives_its_prefixes_to_another_without_waiting():
    pool = make_pool(3, health={"eject_after": 1, "backoff_s": 30})
    keys = turns(0, 3)
    first = pool.acquire(key=keys[0])
    first.release(False)  # failed: ejected for 30 s
    moved = served(pool, keys[1])
    assert moved != first.endpoint.url
    assert served(pool, keys[2]) == moved  # re-recorded where it went
    pool.set_health(next(e for e in pool.endpoints if e.url == moved), False)
    assert served(pool, keys[2]) not in (moved, first.endpoint.url)


def test_a_session_stays_on_its_endpoint_while_within_the_bound():
    pool = make_pool(4)
    header = {"x-specgate-session": "s-1"}
    keys = [PromptKey({"messages": [{"role": "user", "content": f"unrelated {i}"}]}, "chat", header)
            for i in range(20)]
    home = served(pool, keys[0])
    assert {served(pool, key) for key in keys[1:]} == {home}
    assert pool.explain(keys[0])["session"] == "hit"
    by_user = PromptKey({"messages": [{"role": "user", "content": "x"}], "user": "s-1"}, "chat")
    assert served(pool, by_user) == home  # the body's user field is the same key


def test_an_overloaded_session_is_mapped_again():
    pool = make_pool(2)
    key = PromptKey({"messages": [{"role": "user", "content": "hi"}]}, "chat", {"x-specgate-session": "s"})
    home = served(pool, key)
    held = [pool.acquire(exclude=[e for e in pool.endpoints if e.url != home]) for _ in range(4)]
    answer = pool.explain(key)
    assert answer["endpoint"] != home and answer["session"] == "mapped"
    moved = served(pool, key)
    for lease in held:
        lease.release(True)
    assert served(pool, key) == moved  # the session now lives there


def test_the_prefix_map_is_bounded_by_blocks():
    pool = make_pool(2, affinity={"max_blocks": 8})
    balancer = pool.balancer
    assert isinstance(balancer, PrefixAffinity)
    old = turns(0, 1)[0]
    served(pool, old)
    for conversation in range(1, 10):
        served(pool, turns(conversation, 1, {"role": "system", "content": f"s{conversation}"})[0])
        assert len(balancer.prefixes) <= 8
    assert pool.explain(old)["reason"] == "hash"  # forgotten: the rendezvous choice again


def test_a_new_prompt_goes_where_rendezvous_hashing_sends_it_in_every_gateway():
    key = turns(0, 1)[0]
    picks = {make_pool(5).explain(key)["endpoint"] for _ in range(5)}
    assert len(picks) == 1
    spread = Counter(make_pool(5).explain(turns(i, 1, {"role": "system", "content": f"s{i}"})[0])["endpoint"]
                     for i in range(200))
    assert len(spread) == 5 and min(spread.values()) > 20


def test_explain_leases_and_records_nothing():
    pool = make_pool(2)
    key = turns(0, 1)[0]
    assert pool.explain(key) == pool.explain(key)
    assert pool.in_flight == 0 and pool.explain(key)["reason"] == "hash"


def test_requests_without_a_prompt_keep_two_choices():
    pool = make_pool(2)
    busy = pool.acquire()
    assert pool.explain(None)["reason"] == "two_choices"
    assert pool.acquire().endpoint is not busy.endpoint


@pytest.mark.parametrize("affinity", [{"load_factor": 0.9}, {"block_chars": 0}, {"unknown": 1},
                                      {"session_header": "bad header"}])
def test_affinity_settings_are_checked(affinity):
    with pytest.raises(ValueError):
        PoolSpec(kind="standard", endpoints=[{"url": "http://a"}], affinity=affinity)


def test_an_unknown_balance_is_a_policy_error_naming_its_line(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\npools:\n  standard:\n    kind: standard\n    endpoints: [{url: 'http://a'}]\n"
                    "    balance: round_robin\nrules: [{name: all, route: standard}]\n")
    with pytest.raises(PolicyError, match=r"policy.yaml:6: .*balance"):
        load_policy(path)
