"""CPU time of one request's span, apart from the noise of a whole gateway:
the tracing calls one traced request makes (start from a client traceparent,
the ~30 attributes a request carries, the context for the backend, end), then
the export of all of them (OTLP/HTTP protobuf, batched) to bench/otlp_sink.py.

    python bench/span_cost.py --spans 5000
    OTEL_TRACES_SAMPLER=always_off python bench/span_cost.py    # what a span not sampled costs
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
DECISION = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.request.temperature": 0.0,
            "gen_ai.request.max_tokens": 128, "specgate.api": "chat", "specgate.pool": "speculative",
            "specgate.rule": "default", "specgate.reason": "rule default", "specgate.probe": False,
            "specgate.domain": "general", "specgate.predicted.ttft_s": 0.05, "specgate.predicted.tpot_s": 0.01,
            "specgate.predicted.e2e_s": 1.3}
SERVED = {"specgate.served_pool": "speculative", "specgate.fallback": None, "specgate.endpoint": "http://a:8000",
          "specgate.endpoint_why": "least", "specgate.queue_wait_s": None, "specgate.ttfb_s": 0.01,
          "specgate.status": 200, "specgate.measured.ttft_s": 0.05, "specgate.measured.tpot_s": 0.01,
          "specgate.measured.e2e_s": 1.2, "specgate.request_id": "0123456789abcdef"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=5000)
    spans = parser.parse_args().spans
    os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(spans)  # none dropped: every span is exported and counted
    from gateway.telemetry.otlp import OtlpTracer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = subprocess.Popen([sys.executable, str(ROOT / "bench" / "otlp_sink.py"), "--port", str(port)],
                            stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        tracer = OtlpTracer(f"http://127.0.0.1:{port}/v1/traces", "bench")
        started = time.process_time()
        for _ in range(spans):  # as the path calls it: attributes only for a span that records
            span = tracer.start("POST", "/v1/chat/completions", {"traceparent": TRACEPARENT})
            span.propagate([("content-type", "application/json")])
            if span.recording:
                span.rename("chat m")
                span.set(DECISION)
                span.set(SERVED)
            span.end(200)
        path = time.process_time() - started
        tracer.shutdown()
        total = time.process_time() - started
    finally:
        sink.terminate()
    counts = [line for line in sink.communicate()[1].splitlines() if line.startswith("spans ")]
    print(f"spans exported: {counts[-1].split()[1] if counts else 0} of {spans}")
    print(f"CPU per span: {1e6 * path / spans:.0f} us on the request path, "
          f"{1e6 * total / spans:.0f} us with its export")


if __name__ == "__main__":
    main()
