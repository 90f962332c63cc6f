"""`specgate report`: the weekly operations report as Markdown and JSON.

What is read from Prometheus and how: `specgate.ops.weekly`; the acceptance per
traffic class and the retrain hint: `specgate.ops.retrain`; the Markdown:
`specgate.ops.report`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--since", default="7d", help="length of the period: 30m, 12h, 7d, 1w (default: %(default)s)")
    parser.add_argument("--until", help="end of the period, ISO 8601 or Unix seconds (default: now)")
    parser.add_argument("--baseline", type=Path, help="baseline JSON from `specgate baseline record` (for speedup)")
    parser.add_argument("--step", help="spacing of the acceptance points (default: the period / 168, at least 1m)")
    parser.add_argument("--selector", default="",
                        help='PromQL label matcher for the speculative backends\' series, e.g. job="vllm-spec" '
                             "(default: every series)")
    parser.add_argument("--out", type=Path, default=Path("report"), help="directory for report.md and report.json")
    parser.add_argument("--class-label", default="traffic_class",
                        help="label of the acceptance series naming the traffic class (default: %(default)s)")
    parser.add_argument("--previous", type=Path,
                        help="an earlier report.json: classes whose acceptance fell since are named")
    parser.add_argument("--acceptance-drop", type=float, default=0.10,
                        help="a class whose acceptance fell by more than this is named (default: %(default)s)")


def parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def run(args: argparse.Namespace) -> int:
    from gateway.control.baseline import BaselineError, read_baseline
    from gateway.control.signals import SignalError
    from specgate.ops.report import markdown, previous_by_class
    from specgate.ops.retrain import fallen_classes, read_by_class, retrain_section
    from specgate.ops.weekly import Period, parse_duration, read_report

    try:
        seconds = parse_duration(args.since)
        end = parse_time(args.until) if args.until else time.time()
        step = parse_duration(args.step) if args.step else max(60.0, round(seconds / 168 / 60) * 60)
        baseline = read_baseline(args.baseline) if args.baseline else None
        previous = previous_by_class(args.previous)
    except (ValueError, BaselineError) as exc:
        print(f"specgate report: {exc}", file=sys.stderr)
        return 2
    period = Period(start=end - seconds, end=end, step_s=step)
    try:
        report = read_report(args.prometheus, period, baseline, args.selector)
        by_class = read_by_class(args.prometheus, period, args.selector, args.class_label)
    except SignalError as exc:
        print(f"specgate report: {exc}", file=sys.stderr)
        return 1
    report["retrain"] = retrain_section(by_class, fallen_classes(by_class, previous, args.acceptance_drop),
                                        args.class_label)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (args.out / "report.md").write_text(text)
    print(text, end="")
    print(f"wrote {args.out / 'report.md'} and {args.out / 'report.json'}")
    return 0
