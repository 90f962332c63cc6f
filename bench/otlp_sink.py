"""An OTLP/HTTP trace receiver for the overhead benchmark: it accepts
`POST /v1/traces` (protobuf), decodes each export with `opentelemetry-proto`
as a collector would, counts the spans, and answers an empty export response.
After each export it writes the running count to stderr.

    python bench/otlp_sink.py --port 4318
"""

from __future__ import annotations

import argparse
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class Sink(BaseHTTPRequestHandler):
    spans = 0
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        export = ExportTraceServiceRequest()
        export.ParseFromString(self.rfile.read(int(self.headers.get("content-length", 0))))
        Sink.spans += sum(len(s.spans) for r in export.resource_spans for s in r.scope_spans)
        print(f"spans {Sink.spans}", file=sys.stderr, flush=True)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # one line per export is enough
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=4318)
    ThreadingHTTPServer(("127.0.0.1", parser.parse_args().port), Sink).serve_forever()


if __name__ == "__main__":
    main()
