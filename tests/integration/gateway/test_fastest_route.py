"""`route: fastest` through a running gateway: two vLLM-like fakes of different
speeds, the official client, and the latency model fed by the gateway's own
measurements. Counts of requests, never times, are asserted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.fakes.vllm import FakeVllm
from tests.integration.gateway.conftest import ADMIN_TOKEN, Gateway, policy_dict

CHUNKS = 8
FAST_DELAY, SLOW_DELAY = 0.004, 0.04  # seconds before each chunk


def fastest_policy(spec_url: str, std_url: str, **routing) -> dict:
    policy = policy_dict([spec_url], [std_url])
    policy["rules"] = [{"name": "default", "route": "fastest"}]
    policy["routing"] = {"typical_output_tokens": 16, "half_life_s": 2.0, **routing}
    return policy


@pytest.fixture
def spec_fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="upstream-spec", kind="speculative") as fake:
        fake.script(text=" ".join(["word"] * CHUNKS), chunks=CHUNKS, delay=SLOW_DELAY)
        yield fake


@pytest.fixture
def std_fake() -> Iterator[FakeVllm]:
    with FakeVllm(model="upstream-std", kind="standard") as fake:
        fake.script(text=" ".join(["word"] * CHUNKS), chunks=CHUNKS, delay=FAST_DELAY)
        yield fake


def streamed(client: openai.OpenAI) -> str:
    """One streamed request, read to its end; the pool that served it."""
    with client.chat.completions.with_streaming_response.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=16, temperature=0,
            stream=True) as response:
        for _ in response.iter_lines():
            pass
        return response.headers["x-specgate-pool"]


@pytest.mark.slow  # seconds of wall time: it runs in `make test`, not `make check`
def test_requests_go_to_the_faster_pool_and_move_when_it_slows(start_gateway, spec_fake, std_fake):
    gateway = start_gateway(fastest_policy(spec_fake.url, std_fake.url))
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        warm_up(client, at_least=20)  # the priors favour the speculative pool; its answers disagree
        steady = Counter(streamed(client) for _ in range(20))
        assert steady["standard"] >= 16, steady  # the standard fake is 10x faster per token

        std_fake.script(delay=SLOW_DELAY * 2)  # now the standard pool is the slow one
        served: list[str] = []
        while served[-5:] != ["speculative"] * 5:
            served.append(streamed(client))
            assert len(served) <= 25, f"still not moved after {served}"

    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'specgate_route_decisions_total{api="chat",explored="false",pool="standard",rule="default"}' in metrics
    assert "specgate_predicted_e2e_seconds_bucket" in metrics


def test_explain_shows_each_candidates_prediction(gateway_with_traffic):
    gateway = gateway_with_traffic
    answer = httpx.post(gateway.url + "/admin/explain", headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                        json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16,
                              "temperature": 0})
    assert answer.status_code == 200, answer.text
    decision = answer.json()
    found = decision["fastest"]
    assert decision["rule"] == "default" and decision["explored"] == found["explored"]
    assert {c["pool"] for c in found["candidates"]} == {"speculative", "standard"}
    for candidate in found["candidates"]:
        assert candidate["e2e_s"] == pytest.approx(candidate["ttft_s"] + 16 * candidate["tpot_s"])
        assert candidate["stddev_e2e_s"] > 0 and candidate["sampled_cost_s"] >= candidate["added_s"] >= 0
        assert candidate["cost_s"] == pytest.approx(candidate["e2e_s"] + candidate["added_s"])
    assert decision["admission"] == {"held_now": 0, "hold": None}  # no pool states an objective
    measured = {c["pool"]: c["samples"] for c in found["candidates"]}
    assert measured["standard"] > 0, "the standard pool's answers were measured"
    assert decision["chain"][0] == decision["pool"] and set(decision["chain"]) == {"speculative", "standard"}
    tables = httpx.get(gateway.url + "/admin/latency", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert {(pair["pool"], pair["class"]) for pair in tables["pairs"]} >= {("standard", "chat/greedy")}


@pytest.fixture
def gateway_with_traffic(start_gateway, spec_fake, std_fake) -> Gateway:
    gateway = start_gateway(fastest_policy(spec_fake.url, std_fake.url))
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        warm_up(client)
    return gateway


def warm_up(client: openai.OpenAI, at_least: int = 6, at_most: int = 80) -> None:
    """Requests until both pools have answered (a cold model reaches the pool its
    priors rank slower only by a draw), and at least `at_least` of them."""
    served: set[str] = set()
    for count in range(1, at_most + 1):
        served.add(streamed(client))
        if count >= at_least and served == {"speculative", "standard"}:
            return
    raise AssertionError(f"{at_most} requests did not reach both pools: {served}")


def test_a_burst_splits_between_two_identical_pools(start_gateway, spec_fake, std_fake):
    """The load a decision reads includes the requests just routed (their leases):
    of two identical pools, the one measured marginally faster does not take the
    whole burst."""
    # measurements that a slow host does not forget before the burst: with the fixture's 2 s
    # half-life they thinned to a few answers, and the draws' spread, not the load, split it
    policy = fastest_policy(spec_fake.url, std_fake.url, half_life_s=600.0)
    policy["pools"]["speculative"]["kind"] = "standard"  # the same priors for both
    gateway = start_gateway(policy)
    model = gateway.app.state.parts.latency
    # Both measured, one a hair faster (the case a burst would herd on), at every load the burst
    # reaches: measured only idle, the loaded buckets read the priors' spread (a third of E2E), and
    # about one burst in 300 drew a 13-3 split or worse (the draws, not the load, split it).
    for load in range(20):
        for _ in range(20):
            slower = 1 + 0.1 * load  # each running sequence slows a token by a tenth
            model.observe("speculative", "chat/greedy", load, 0.010 * slower, 0.0010 * slower)
            model.observe("standard", "chat/greedy", load, 0.0105 * slower, 0.00105 * slower)
    holds = [spec_fake.hold(), std_fake.hold()]
    burst = 16
    pools: list[str] = []
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        threads = [threading.Thread(target=lambda: pools.append(streamed(client))) for _ in range(burst)]
        for thread in threads:
            thread.start()
        while len(spec_fake.completion_requests()) + len(std_fake.completion_requests()) < burst:
            time.sleep(0.01)  # every request of the burst is in flight, held after its first chunk
        in_flight = {"speculative": len(spec_fake.completion_requests()),
                     "standard": len(std_fake.completion_requests())}
        for hold in holds:
            hold.set()
        for thread in threads:
            thread.join()
    assert min(in_flight.values()) >= burst // 4, in_flight
    assert Counter(pools) == Counter(in_flight)


def test_a_full_chosen_pool_spills_to_the_next_candidate(start_gateway, spec_fake, std_fake):
    """The chain of a fastest decision holds every candidate: the standard pool,
    measured far faster, is chosen while it is full, and the request goes on to
    the speculative pool instead of waiting for it or failing."""
    policy = fastest_policy(spec_fake.url, std_fake.url)
    policy["pools"]["standard"]["max_in_flight"] = 1
    gateway = start_gateway(policy)
    model = gateway.app.state.parts.latency
    for _ in range(50):
        model.observe("speculative", "chat/greedy", 0, 0.5, 0.05)
        model.observe("standard", "chat/greedy", 0, 0.01, 0.001)
        model.observe("standard", "chat/greedy", 1, 0.01, 0.001)
    hold = std_fake.hold()
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        first = threading.Thread(target=streamed, args=(client,))
        first.start()
        while not std_fake.holding.is_set():
            time.sleep(0.01)  # the standard pool's one slot is taken
        with client.chat.completions.with_streaming_response.create(
                model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=16, temperature=0,
                stream=True) as response:
            served, reason = response.headers["x-specgate-pool"], response.headers.get("x-specgate-reason")
            for _ in response.iter_lines():
                pass
        hold.set()
        first.join()
    assert (served, reason) == ("speculative", "fallback:full")


def test_a_request_past_every_objective_waits_at_the_gateway_until_a_lease_comes_back(
        start_gateway, spec_fake, std_fake):
    """Both pools state `slo: {tpot_s: 1.0}` and are measured far past it with one
    request running; one more would slow that batch, so it is held at the gateway
    (not sent, not refused) and goes in once the running requests finish. Its budget,
    its own objective (16 tokens x 1 s), is far longer than the test needs to release
    them: it must go in because a lease came back, not because its budget ran out."""
    policy = fastest_policy(spec_fake.url, std_fake.url)
    for pool in policy["pools"].values():
        pool["slo"] = {"tpot_s": 1.0}
    gateway = start_gateway(policy)
    model = gateway.app.state.parts.latency
    for pool in ("speculative", "standard"):
        for _ in range(50):  # alone: far under the objective; with company: past it, and steeply
            model.observe(pool, "chat/greedy", 0, 0.01, 0.001)
            model.observe(pool, "chat/greedy", 2, 0.01, 5.0)
            model.observe(pool, "chat/greedy", 5, 0.01, 50.0)
    holds = [spec_fake.hold(), std_fake.hold()]
    served: list[str] = []
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        running = [threading.Thread(target=routed_to, args=(client, pool)) for pool in ("speculative", "standard")]
        for thread in running:
            thread.start()
        while len(spec_fake.completion_requests()) + len(std_fake.completion_requests()) < 2:
            time.sleep(0.01)  # one request runs on each pool, paused after its first chunk
        extra = threading.Thread(target=lambda: served.append(streamed(client)))
        extra.start()
        while gauge(gateway, "specgate_admission_held") < 1:
            time.sleep(0.01)
        assert len(spec_fake.completion_requests()) + len(std_fake.completion_requests()) == 2, "not sent on"
        for hold in holds:
            hold.set()
        for thread in (*running, extra):
            thread.join()
    assert len(served) == 1 and served[0] in ("speculative", "standard")
    assert gauge(gateway, "specgate_admission_held") == 0
    assert gauge(gateway, 'specgate_admission_holds_total{outcome="released"}') == 1


def routed_to(client: openai.OpenAI, pool: str) -> None:
    with client.chat.completions.with_streaming_response.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=16, temperature=0,
            stream=True, extra_headers={"x-specgate-route": pool}) as response:
        for _ in response.iter_lines():
            pass


def gauge(gateway: Gateway, series: str) -> float:
    for line in httpx.get(gateway.url + "/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0
