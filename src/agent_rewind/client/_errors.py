"""Rendering a failed RPC as a few lines a person can act on, never a traceback."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

# googleapis-common-protos ships .pyi stubs but no py.typed marker; the second code keeps this line
# clean once mypy is told to follow google.rpc's stubs (follow_untyped_imports).
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped, unused-ignore]

# Where gRPC carries the google.rpc.Status of a failed call (the same key grpc_status reads).
_DETAILS_KEY = "grpc-status-details-bin"
_UNREACHABLE_HINT = "is the server running (`make run` in another terminal)?"


def code_name(code: int) -> str:
    """`5` -> `NOT_FOUND`."""
    try:
        name: str = code_pb2.Code.Name(code)
    except ValueError:
        return f"CODE_{code}"
    return name


def status_from_error(error: Any) -> status_pb2.Status:
    """The google.rpc.Status of a failed call, or one built from its code and details.

    Parsed from the trailing metadata directly rather than by `grpc_status.rpc_status.from_call`,
    which raises when code or message disagree with the header; we want to show whatever arrived.
    """
    rich: status_pb2.Status | None = None
    trailing: Any = None
    try:
        trailing = error.trailing_metadata()
    except AttributeError:  # not a grpc.Call: there are no details to read
        trailing = None
    for key, value in trailing or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            try:
                rich = status_pb2.Status.FromString(value)
            except DecodeError:  # undecodable details: fall back to the plain code and message
                rich = None
            break
    if rich is None:
        rich = status_pb2.Status()
    code = _call_code(error)
    if code is not None and not rich.code:
        rich.code = code
    if not rich.message:
        rich.message = _call_details(error)
    return rich


def _call_code(error: Any) -> int | None:
    try:
        value = error.code().value
    except AttributeError:
        return None
    # grpc.StatusCode values are (int, "name") tuples.
    if isinstance(value, tuple) and value and isinstance(value[0], int):
        return value[0]
    return None


def _call_details(error: Any) -> str:
    try:
        details = error.details()
    except AttributeError:
        return str(error)
    return str(details or "")


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    return None


def is_unreachable(status: status_pb2.Status) -> bool:
    """UNAVAILABLE from the channel itself (no ErrorInfo), as opposed to the service's AGENT_UNAVAILABLE."""
    return status.code == code_pb2.UNAVAILABLE and error_info(status) is None


def render_status(status: status_pb2.Status, *, server: str | None = None) -> list[str]:
    """`error: <STATUS> <REASON>: <message>`, then metadata and field violations, one per line."""
    name = code_name(status.code)
    if is_unreachable(status):
        where = f" at {server}" if server else ""
        first = status.message.splitlines()[0] if status.message else "unavailable"
        return [f"error: cannot reach agent-rewind{where} ({first}); {_UNREACHABLE_HINT}"]
    info = error_info(status)
    head = f"error: {name} {info.reason}" if info and info.reason else f"error: {name}"
    lines = [f"{head}: {status.message}" if status.message else head]
    if info is not None:
        lines.extend(f"  {key}: {info.metadata[key]}" for key in sorted(info.metadata))
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            lines.extend(f"  field {v.field}: {v.description}" for v in bad.field_violations)
            continue
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(retry):
            delay = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
            lines.append(f"  retry after {delay:g}s")
    return lines


def render_rpc_error(error: Any, *, server: str | None = None) -> list[str]:
    """The lines `render_status` gives for a raised grpc.RpcError."""
    return render_status(status_from_error(error), server=server)
