"""A real OTLP trace receiver on loopback: the collector's TraceService (opentelemetry-proto) over
gRPC, keeping every span the servers export, as plain records a test can query."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
INTERNAL = trace_pb2.Span.SPAN_KIND_INTERNAL


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def _attributes(attributes: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in attributes}


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    status_code: int
    status_message: str
    resource: dict[str, Any]

    @property
    def replica(self) -> str:
        return str(self.resource.get("service.instance.id", ""))

    def text(self) -> str:
        """Everything the span says, as one string (to look for what must not be in it)."""
        return repr((self.name, self.attributes, self.events, self.status_message, self.resource))


@dataclass
class OtlpReceiver:
    server: grpc.aio.Server
    port: int
    spans: list[ReceivedSpan] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    async def start(cls) -> OtlpReceiver:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        receiver = cls(server, port)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(receiver), server)
        await server.start()
        return receiver

    async def stop(self) -> None:
        await self.server.stop(0)

    def keep(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            events=tuple((e.name, _attributes(e.attributes)) for e in span.events),
                            status_code=span.status.code,
                            status_message=span.status.message,
                            resource=resource,
                        )
                    )


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    async def Export(  # noqa: N802
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.aio.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._receiver.keep(request)
        return trace_service_pb2.ExportTraceServiceResponse()
