"""A real OTLP/HTTP trace receiver on 127.0.0.1: it accepts `POST /v1/traces`
in protobuf, decodes each `ExportTraceServiceRequest` with `opentelemetry-proto`
and keeps the spans, as a collector would::

    with OtlpReceiver() as receiver:
        ...                                  # something exports to receiver.url
        span = receiver.spans[0]             # opentelemetry.proto.trace.v1.trace_pb2.Span
        receiver.attributes(span)["gen_ai.request.model"]
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.serving.server import BackgroundServer

PROTOBUF = "application/x-protobuf"


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.services: list[str] = []  # each span's resource's service.name
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"])])
        self.server = BackgroundServer(app)

    @property
    def url(self) -> str:
        return self.server.url

    async def _traces(self, request: Request) -> Response:
        if request.headers.get("content-type") != PROTOBUF:
            return Response(status_code=415)
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.body())
        with self._lock:
            for resource_spans in export.resource_spans:
                service = self.attributes(resource_spans.resource).get("service.name", "")
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)
                    self.services.extend(service for _ in scope_spans.spans)
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF)

    @staticmethod
    def attributes(holder: Any) -> dict[str, Any]:
        """A span's (or resource's) attributes as plain Python values."""
        return {kv.key: _plain(kv.value) for kv in holder.attributes}

    def __enter__(self) -> OtlpReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.stop()


def _plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None
