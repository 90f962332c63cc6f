"""Validate a policy file: exit 0 when valid, else print PATH:LINE: message and exit 1."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="policy YAML file to validate")


def run(args: argparse.Namespace) -> int:
    from gateway.policy.loader import PolicyError, load_policy

    try:
        policy = load_policy(args.path)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{args.path}: ok ({len(policy.pools)} pools, {len(policy.rules)} rules)")
    return 0
