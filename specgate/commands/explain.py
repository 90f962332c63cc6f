"""Print the routing decision for a request body as JSON, sending nothing upstream.

A `route: fastest` decision shows each candidate's predicted TTFT, TPOT and
E2E with its uncertainty and samples; here the latency model has measured
nothing, so those are its priors (a running gateway's are at POST /admin/explain).
`endpoint` is the endpoint of the chosen pool it would take, and why; here no
prefix or session has been seen, so a pool that balances by prefix shows the
rendezvous choice every gateway makes for a prompt it has not seen.

Example: specgate explain --policy policies/default.yaml request.json --load speculative=9
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _load_pair(text: str) -> tuple[str, int]:
    pool, sep, count = text.partition("=")
    if not sep or not count.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected POOL=N, got {text!r}")
    return pool.strip(), int(count)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gateway.decide.api_paths import ENDPOINTS

    parser.add_argument("--policy", type=Path, help="policy YAML (default: policies/default.yaml)")
    parser.add_argument("request", help="request body JSON file ('-' for stdin)")
    parser.add_argument("--load", type=_load_pair, action="append", default=[], metavar="POOL=N",
                        help="requests in flight on a pool (repeatable)")
    parser.add_argument("--endpoint", choices=list(ENDPOINTS),
                        help="API the body is for (default: from its shape: input -> responses, prompt -> "
                             "completions, system or metadata.user_id -> messages, else chat)")
    parser.add_argument("--session", metavar="KEY",
                        help="the session key the request carries (the pool's session header)")
    parser.add_argument("--seed", type=int,
                        help="draw the Thompson samples with this seed (default: choose by the predicted mean)")


def run(args: argparse.Namespace) -> int:
    import random

    from gateway.decide.apis import explained_endpoint
    from gateway.decide.features import parse_json_body
    from gateway.decide.routing import route
    from gateway.errors import GatewayError
    from gateway.flags import FlagStore
    from gateway.policy.loader import PolicyError, load_policy
    from gateway.settings import default_policy_path
    from gateway.upstream.pools import Pool
    from gateway.upstream.prompt_key import PromptKey

    try:
        policy = load_policy(args.policy or default_policy_path())
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    unknown = [pool for pool, _ in args.load if pool not in policy.pools]
    if unknown:
        print(f"--load names unknown pool(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    raw = sys.stdin.buffer.read() if args.request == "-" else Path(args.request).read_bytes()
    try:
        body = parse_json_body(raw)
        endpoint = explained_endpoint(args.endpoint, body)
        load = {name: 0 for name in policy.pools} | dict(args.load)
        flags = FlagStore(policy.speculative_pools).snapshot()
        rng = None if args.seed is None else random.Random(args.seed)
        routed = route(body, endpoint, policy, load, flags, rng=rng)
    except GatewayError as exc:
        print(f"{args.request}: {exc.message}", file=sys.stderr)
        return 1
    answer = routed.to_json(flags)
    pool = routed.decision.pool
    spec = policy.pools[pool]
    headers = {} if args.session is None else {spec.affinity.session_header.lower(): args.session}
    answer["endpoint"] = Pool(pool, spec).explain(PromptKey(body, endpoint, headers))
    print(json.dumps(answer, indent=2))
    return 0
