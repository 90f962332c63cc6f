"""`specgate compile` builds the request path with mypyc, and the build decides exactly as
the sources do: the same pools, rules, chains, draws and predictions on the shipped default
policy, for every kind of prompt, at loads from idle to past the objectives' rooms, with the
latency model learning from answers between decisions. And the gateway's request-path tests
pass with the build loaded: the same answers, errors, streams, metrics and log lines."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first test waits for the build: minutes on 2 cores

DECISIONS = textwrap.dedent("""
    import itertools, json, random, sys
    from pathlib import Path
    from specgate.compiled import use_compiled
    loaded = use_compiled(sys.argv[1], Path(sys.argv[2]))
    from gateway.decide import routing
    from gateway.decide.latency import LatencyModel, LatencyPriors
    from gateway.flags import FlagStore
    from gateway.policy.classes import traffic_class
    from gateway.policy.loader import load_policy
    from gateway.settings import default_policy_path

    policy = load_policy(default_policy_path())
    routing_spec = policy.spec.routing
    model = LatencyModel(policy.schedules, LatencyPriors(routing_spec.priors), half_life_s=routing_spec.half_life_s,
                         clock=lambda ticks=itertools.count(): 1000.0 + next(ticks) * 0.002)
    rng, draw = random.Random(1), random.Random(2)
    flags = FlagStore(list(policy.speculative_pools)).snapshot()
    domains = (*policy.spec.domains, policy.spec.default_domain)
    prompts = ["What should I plant in a small garden?", "```python\\ndef f(x):\\n    return x\\n```\\nrefactor",
               "Solve 3x + 4 = 19 for x.", " ".join(["river stone water"] * 300)]
    out = []
    for i in range(600):
        body = {"model": "m", "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                "temperature": (0.0, 0.7, 1.3)[i % 3], "max_tokens": (16, 256, 2048)[i % 3]}
        load = {pool: rng.choice((0, 1, 3, 17, 60, 250)) for pool in policy.pools}
        routed = routing.route(body, "chat", policy, load, flags, draw=draw.random(), model=model, rng=draw)
        out.append({k: v for k, v in routed.to_json(flags).items() if k != "flags"})  # flags: when they were made
        pool = rng.choice(list(policy.pools))
        cls = traffic_class(rng.choice(domains), rng.choice((0.0, 0.8)))
        served = rng.randint(1, 256)
        model.observe(pool, cls, served, 0.05 + served * 1e-4, 0.02 + served * 2e-4,
                      per_step=2.0 if pool in policy.speculative_pools else None)
    print(json.dumps({"compiled": routing.__file__.endswith(".so"), "why": loaded.why, "decisions": out}))
""")


def _decisions(script: Path, mode: str, build: Path) -> dict:
    done = subprocess.run([sys.executable, str(script), mode, str(build)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _close(a: object, b: object) -> bool:
    """Equal, floats within a few units in the last place (a C compiler may contract a * b + c)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-15)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build for this module's tests (about 6.5 minutes on 2 cores)."""
    build = tmp_path_factory.mktemp("compiled") / "build"
    done = subprocess.run([sys.executable, "-m", "specgate.cli", "compile", "--out", str(build)],
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (build / "manifest.json").is_file()
    return build


def test_a_compiled_build_is_loaded_and_decides_as_the_sources_do(tmp_path, build):
    script = tmp_path / "decisions.py"
    script.write_text(DECISIONS)
    compiled = _decisions(script, "require", build)
    sources = _decisions(script, "off", build)
    assert compiled["compiled"] and not sources["compiled"], (compiled["why"], sources["why"])
    pools = {d["pool"] for d in sources["decisions"]}
    assert len(pools) > 1 and any(d["fastest"] and d["fastest"]["past_room"] for d in sources["decisions"])
    for i, (ours, theirs) in enumerate(zip(compiled["decisions"], sources["decisions"], strict=True)):
        assert _close(ours, theirs), (i, ours, theirs)


REQUEST_PATH_TESTS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from specgate.compiled import use_compiled
    loaded = use_compiled("require", Path(sys.argv[1]))  # before anything imports the gateway
    print(json.dumps({"modules": loaded.modules}), flush=True)
    import pytest
    sys.exit(pytest.main(sys.argv[2:]))
""")


def test_the_request_paths_tests_pass_on_the_compiled_build(tmp_path, build):
    """The gateway's integration tests (those that start no process of their own), run with every
    module of the build served compiled: a compiled module checks its arguments' types and builds
    its classes its own way, and this is where a difference would show."""
    script = tmp_path / "request_path.py"
    script.write_text(REQUEST_PATH_TESTS)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script), str(build), "-q", "-p", "no:cacheprovider", "-m", "not slow",
                           # the build imports anyio (through Starlette) before pytest's plugins load
                           "-W", "ignore::pytest.PytestAssertRewriteWarning", str(root / "tests/integration/gateway")],
                          capture_output=True, text=True, timeout=1800, cwd=root)
    assert done.returncode == 0, done.stdout[-5000:]
    loaded = json.loads(done.stdout.splitlines()[0])["modules"]
    assert {"gateway.upstream.exchange", "gateway.upstream.pools", "gateway.decide.routing",
            "gateway.edge.http_protocol", "gateway.edge.response_cycle"} <= set(loaded), loaded
    assert " passed" in done.stdout.splitlines()[-1] and " failed" not in done.stdout.splitlines()[-1], done.stdout
