"""A fake vLLM as its own process, for tests that need one outside theirs (soak, `specgate up`).

    python -m tests.fakes.vllm_command --port 8001 --kind standard --fail-rate 0.05

Serves until SIGTERM or Ctrl-C; `--record PATH` then writes the /v1 arrival
times and the faults dealt as JSON.
"""

from __future__ import annotations

import argparse
import json
import signal

from tests.fakes.vllm import FakeVllm, Script


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a fake vLLM server until interrupted.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--kind", choices=("speculative", "standard", "dynamic"), default="speculative",
                        help="dynamic: drafts as a speculative one does (a fake has no batch for a schedule to read)")
    parser.add_argument("--text", default=Script.text)
    parser.add_argument("--chunks", type=int, default=Script.chunks)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each chunk")
    parser.add_argument("--spec-acceptance", type=float, default=None)
    faults = parser.add_argument_group("random faults (soak tests)")
    faults.add_argument("--seed", type=int, default=None, help="seed of the fault RNG")
    faults.add_argument("--fail-rate", type=float, default=0.0, help="share of /v1 requests that fail")
    faults.add_argument("--fail-status", type=int, default=500, help="status of a failed request")
    faults.add_argument("--slow-rate", type=float, default=0.0,
                        help="share of /v1 requests whose first byte is late")
    faults.add_argument("--slow-seconds", type=float, default=0.0, help="how late a slow first byte is")
    faults.add_argument("--cut-rate", type=float, default=0.0,
                        help="share of /v1 responses whose connection drops mid-body")
    faults.add_argument("--cut-after", type=int, default=2, help="body writes sent before a cut")
    faults.add_argument("--record", default=None, metavar="PATH",
                        help="on exit, write the /v1 arrival times (time.monotonic) and the "
                        "faults dealt to PATH as JSON")
    args = parser.parse_args(argv)
    fake = FakeVllm(
        args.model,
        "speculative" if args.kind == "dynamic" else args.kind,
        host=args.host,
        port=args.port,
        spec_acceptance=args.spec_acceptance,
        script=Script(text=args.text, chunks=args.chunks, delay=args.delay),
    )
    fake.faults_at_random(args.seed, args.fail_rate, args.fail_status, args.slow_rate,
                          args.slow_seconds, args.cut_rate, args.cut_after)
    fake.start()
    print(f"fake vLLM ({args.kind}) serving {args.model} on {fake.url}", flush=True)
    # SIGTERM ends the process like Ctrl-C: the server stops, then we exit.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop()
        if args.record:
            arrivals = [r.received_at for r in fake.completion_requests()]
            with open(args.record, "w") as out:
                json.dump({"arrivals": arrivals, "faults": fake.faults.injected}, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
