"""The one place where domain errors become gRPC statuses (AIP-193).

Every status carries a google.rpc.ErrorInfo with domain `agent-rewind.v1` and the
reason API.md names; INVALID_ARGUMENT also carries a google.rpc.BadRequest naming the
field. An unexpected exception becomes INTERNAL / INTERNAL with no stack trace.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from agent_rewind.errors import AgentRewindError, InvalidArgument

DOMAIN = "agent-rewind.v1"

# reason -> status code. A reason missing here is a bug: it maps to INTERNAL and a test fails.
STATUS_BY_REASON: dict[str, grpc.StatusCode] = {
    "SESSION_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "MESSAGE_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "NOT_A_REWIND_POINT": grpc.StatusCode.INVALID_ARGUMENT,
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "TURN_IN_FLIGHT": grpc.StatusCode.FAILED_PRECONDITION,
    "NO_CONVERSATION_ANCHOR": grpc.StatusCode.FAILED_PRECONDITION,
    "FILE_CHECKPOINT_UNAVAILABLE": grpc.StatusCode.FAILED_PRECONDITION,
    "CHECKPOINTING_DISABLED": grpc.StatusCode.FAILED_PRECONDITION,
    "REWIND_CONFLICT": grpc.StatusCode.ABORTED,
    "REQUEST_ID_REUSED": grpc.StatusCode.INVALID_ARGUMENT,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "UNAUTHENTICATED": grpc.StatusCode.UNAUTHENTICATED,
    "WORKSPACE_OUTSIDE_ROOT": grpc.StatusCode.INVALID_ARGUMENT,
    "AGENT_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "CURSOR_EXPIRED": grpc.StatusCode.OUT_OF_RANGE,
    "SUBSCRIBER_TOO_SLOW": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "SESSION_ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "SHUTTING_DOWN": grpc.StatusCode.UNAVAILABLE,
    "UNIMPLEMENTED": grpc.StatusCode.UNIMPLEMENTED,
    "OPTION_NOT_ALLOWED": grpc.StatusCode.INVALID_ARGUMENT,
    "WORKSPACE_IN_USE": grpc.StatusCode.INVALID_ARGUMENT,
    "LIVE_SESSIONS_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "EXTERNAL_CHANGES": grpc.StatusCode.FAILED_PRECONDITION,
    "UNDO_UNAVAILABLE": grpc.StatusCode.FAILED_PRECONDITION,
    "SNAPSHOT_UNAVAILABLE": grpc.StatusCode.FAILED_PRECONDITION,
    "REPLICA_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "INTERNAL": grpc.StatusCode.INTERNAL,
    # Not in API.md's table (docs/errors.md): per-principal limits, a ledger that cannot be written.
    "QUOTA_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "STORAGE_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    # Round 4 (API.md): paths, reverts of one turn, retention.
    "PATH_OUTSIDE_WORKSPACE": grpc.StatusCode.INVALID_ARGUMENT,
    "REVERT_CONFLICT": grpc.StatusCode.FAILED_PRECONDITION,
    "FILES_PRUNED": grpc.StatusCode.FAILED_PRECONDITION,
}


def _pack(message: error_details_pb2.ErrorInfo | error_details_pb2.BadRequest) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


# A status travels in the response's trailers, which clients cap (8 KiB by default): what a
# request sent back in an error is cut so the error always arrives whole.
_MAX_MESSAGE = 1024
_MAX_VALUE = 256


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def to_status(err: AgentRewindError) -> status_pb2.Status:
    code = STATUS_BY_REASON.get(err.reason, grpc.StatusCode.INTERNAL)
    metadata = {k: _cut(v, _MAX_VALUE) for k, v in err.metadata.items()}
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN, metadata=metadata)
    details = [_pack(info)]
    if isinstance(err, InvalidArgument):
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=_cut(err.field, _MAX_VALUE), description=_cut(err.description, _MAX_MESSAGE)
        )
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[violation])))
    return status_pb2.Status(code=code.value[0], message=_cut(err.message, _MAX_MESSAGE), details=details)


def internal_status() -> status_pb2.Status:
    info = error_details_pb2.ErrorInfo(reason="INTERNAL", domain=DOMAIN)
    return status_pb2.Status(
        code=code_pb2.INTERNAL, message="internal error; see the server log", details=[_pack(info)]
    )


def reason_in(status: grpc.Status) -> str:
    """The contract's reason a status carries (its ErrorInfo, as `to_status` packs it), or its
    code's name when it carries none (a transport's own status): what a trace records of it."""
    for key, value in status.trailing_metadata or ():
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        try:
            details = status_pb2.Status.FromString(value).details
        except Exception:  # not ours to judge: the status is relayed as it is anyway
            break
        for packed in details:
            info = error_details_pb2.ErrorInfo()
            if packed.Unpack(info) and info.reason:
                return str(info.reason)
    return str(status.code.name)


async def abort(context: grpc.aio.ServicerContext, err: AgentRewindError) -> None:
    await context.abort_with_status(rpc_status.to_status(to_status(err)))


async def abort_internal(context: grpc.aio.ServicerContext) -> None:
    await context.abort_with_status(rpc_status.to_status(internal_status()))
