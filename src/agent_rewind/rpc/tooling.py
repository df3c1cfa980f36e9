"""What generic gRPC tools need of the server: health (Check, Watch and List), and reflection in
both its protocols (grpc.reflection.v1 and v1alpha), with the error-detail types in it.

grpcio-health-checking's servicer advertises Health/List but answers it UNIMPLEMENTED;
grpcio-reflection serves only v1alpha, which `buf curl --reflect-protocol grpc-v1` and newer
grpcurl builds do not speak. v1 is the same protocol under a new name, message for message, so
the v1alpha servicer answers both, from a descriptor pool of its own that also holds v1's file.

Every error carries `google.rpc.ErrorInfo` (and `BadRequest` for a bad field), packed in an Any.
A reflection client decodes an Any only with the types of the files it fetched for the service,
and no file of the contract imports `google/rpc/error_details.proto` (clients in other languages
are built against those files as they are). So the reflected `error_reason.proto`, the enum of
ErrorInfo's reasons, names `google/rpc/error_details.proto` as a dependency: a tool that fetches
the services gets the detail types with them, and prints the details as JSON, not base64.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from agent_rewind.api.v1 import error_reason_pb2

REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"
# The files whose types the errors carry (google.rpc.Status wraps them in grpc-status-details-bin).
DETAIL_FILES = (error_details_pb2.DESCRIPTOR, status_pb2.DESCRIPTOR)
_ERRORS_FILE = error_reason_pb2.DESCRIPTOR.name


class Health(health.aio.HealthServicer):  # type: ignore[misc]  # grpc_health has no types
    """grpc.health.v1.Health, List included (every service's status)."""

    async def List(  # noqa: N802 - gRPC method name
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthListResponse:
        statuses = {
            name: health_pb2.HealthCheckResponse(status=status)
            for name, status in self._server_status.items()
        }
        return health_pb2.HealthListResponse(statuses=statuses)


def _in_order(roots: Iterable[FileDescriptor]) -> list[FileDescriptor]:
    """`roots` and every file they import, each after its imports."""
    ordered: list[FileDescriptor] = []
    seen: set[str] = set()

    def visit(file: FileDescriptor) -> None:
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            visit(dependency)
        ordered.append(file)

    for root in roots:
        visit(root)
    return ordered


def reflection_pool(service_files: Iterable[FileDescriptor]) -> descriptor_pool.DescriptorPool:
    """The files reflection serves: the services' (with the detail types tied to the errors'
    file), the detail types', and both reflection protocols'."""
    pool = descriptor_pool.DescriptorPool()
    tied = {f.name for f in service_files}
    roots = (*DETAIL_FILES, *service_files, reflection_pb2.DESCRIPTOR)
    for file in _in_order(roots):
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        if proto.name in tied:
            proto.dependency.extend(d.name for d in DETAIL_FILES if d.name not in proto.dependency)
        pool.AddSerializedFile(proto.SerializeToString())
        if file is reflection_pb2.DESCRIPTOR:
            proto.name, proto.package = _V1_FILE, "grpc.reflection.v1"
            for message in proto.message_type:
                for field in message.field:
                    if field.type_name.startswith(".grpc.reflection.v1alpha."):
                        field.type_name = ".grpc.reflection.v1." + field.type_name.rsplit(".", 1)[1]
            for method in proto.service[0].method:
                method.input_type = method.input_type.replace(".v1alpha.", ".v1.")
                method.output_type = method.output_type.replace(".v1alpha.", ".v1.")
            pool.AddSerializedFile(proto.SerializeToString())
    return pool


def enable_reflection(server: grpc.aio.Server, services: Iterable[ServiceDescriptor]) -> None:
    """Reflection v1alpha and v1 on `server`, listing `services`, health and both reflection
    services."""
    services = (*services, health_pb2.DESCRIPTOR.services_by_name["Health"])
    files = (*(s.file for s in services), error_reason_pb2.DESCRIPTOR)
    names = (*(s.full_name for s in services), reflection.SERVICE_NAME, REFLECTION_V1)
    servicer = reflection.aio.ReflectionServicer(names, pool=reflection_pool(files))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
    )
