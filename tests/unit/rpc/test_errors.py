"""The one mapping from domain errors to gRPC statuses (API.md's Errors table, AIP-193)."""

from __future__ import annotations

import inspect
import re
import traceback
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

from agent_rewind import errors
from agent_rewind.errors import NEXT_STEPS, AgentRewindError, InvalidArgument
from agent_rewind.rpc.errors import (
    DOMAIN,
    STATUS_BY_REASON,
    abort,
    abort_internal,
    internal_status,
    to_status,
)
from tests import contract

# The contract's Errors table (API.md), read from the contract itself: reason -> status.
API_TABLE: dict[str, int] = {
    reason: getattr(code_pb2, status) for reason, status in contract.error_table().items()
}
# Reasons the service needs beyond the contract's table (rpc/errors.py says why).
EXTRA_TABLE: dict[str, int] = {
    "QUOTA_EXCEEDED": code_pb2.RESOURCE_EXHAUSTED,
    "STORAGE_UNAVAILABLE": code_pb2.UNAVAILABLE,
    "INTERNAL": code_pb2.INTERNAL,
    # Named by the contract's round 4 prose, not its table.
    "PATH_OUTSIDE_WORKSPACE": code_pb2.INVALID_ARGUMENT,
    "REVERT_CONFLICT": code_pb2.FAILED_PRECONDITION,
    "FILES_PRUNED": code_pb2.FAILED_PRECONDITION,
}
EXPECTED = {**API_TABLE, **EXTRA_TABLE}

# One instance of every domain error class, with the metadata it must carry.
SAMPLES: dict[type[AgentRewindError], tuple[Callable[[], AgentRewindError], dict[str, str]]] = {
    errors.SessionNotFound: (lambda: errors.SessionNotFound("s-1"), {"session_id": "s-1"}),
    errors.MessageNotFound: (lambda: errors.MessageNotFound("m-1"), {"message_id": "m-1"}),
    errors.NotARewindPoint: (
        lambda: errors.NotARewindPoint("m-1", "a tool result"),
        {"message_id": "m-1", "kind": "a tool result"},
    ),
    errors.InvalidArgument: (lambda: errors.InvalidArgument("page_size", "too big"), {"field": "page_size"}),
    errors.TurnInFlight: (lambda: errors.TurnInFlight("s-1"), {"session_id": "s-1"}),
    errors.NoConversationAnchor: (lambda: errors.NoConversationAnchor("m-1"), {"message_id": "m-1"}),
    errors.FileCheckpointUnavailable: (
        lambda: errors.FileCheckpointUnavailable("m-1", "No file checkpoint found"),
        {"message_id": "m-1", "sdk_error": "No file checkpoint found"},
    ),
    errors.CheckpointingDisabled: (lambda: errors.CheckpointingDisabled("s-1"), {"session_id": "s-1"}),
    errors.RewindConflict: (
        lambda: errors.RewindConflict("old", "new"),
        {"last_message_id": "new", "expected_last_message_id": "old"},
    ),
    errors.RequestIdReused: (lambda: errors.RequestIdReused("r-1"), {"request_id": "r-1"}),
    errors.WorkspaceOutsideRoot: (
        lambda: errors.WorkspaceOutsideRoot("/etc", ["/srv/a", "/srv/b"]),
        {"cwd": "/etc", "workspace_roots": "/srv/a,/srv/b"},
    ),
    errors.AgentUnavailable: (lambda: errors.AgentUnavailable("s-1", "exited"), {"session_id": "s-1"}),
    errors.ShuttingDown: (lambda: errors.ShuttingDown(), {}),
    errors.SessionAlreadyExists: (lambda: errors.SessionAlreadyExists("s-1"), {"session_id": "s-1"}),
    errors.NotServed: (lambda: errors.NotServed("WatchRewindEvents"), {"rpc": "WatchRewindEvents"}),
    errors.OptionNotAllowed: (
        lambda: errors.OptionNotAllowed("options.settings", "is not allowed"),
        {"field": "options.settings"},
    ),
    errors.WorkspaceInUse: (lambda: errors.WorkspaceInUse("/w/a", "is another session's"), {"cwd": "/w/a"}),
    errors.LiveSessionsExhausted: (lambda: errors.LiveSessionsExhausted(4), {"max_live_sessions": "4"}),
    errors.ExternalChanges: (lambda: errors.ExternalChanges(["a.txt", "b.txt"]), {"paths": "2"}),
    errors.RevertConflict: (lambda: errors.RevertConflict(["a.txt", "b.txt", "c"]), {"paths": "3"}),
    errors.StorageQuotaExceeded: (
        lambda: errors.StorageQuotaExceeded("principal_storage", 1 << 33, 1 << 32),
        {"limit": "principal_storage", "used_bytes": str(1 << 33), "max_bytes": str(1 << 32)},
    ),
    errors.PathOutsideWorkspace: (
        lambda: errors.PathOutsideWorkspace("../etc", "leaves the workspace"),
        {"field": "paths"},
    ),
    errors.FilesPruned: (lambda: errors.FilesPruned("m-1"), {"message_id": "m-1"}),
    errors.UndoUnavailable: (lambda: errors.UndoUnavailable("r-1", "a turn ran"), {"rewind_id": "r-1"}),
    errors.SnapshotUnavailable: (
        lambda: errors.SnapshotUnavailable("m-1", "over_size"),
        {"message_id": "m-1", "snapshot_state": "over_size"},
    ),
    errors.ReplicaUnavailable: (lambda: errors.ReplicaUnavailable("r-2"), {"replica": "r-2"}),
    errors.QuotaExceeded: (lambda: errors.QuotaExceeded("sessions", 10), {"limit": "sessions", "max": "10"}),
    errors.PermissionDenied: (lambda: errors.PermissionDenied("rewind"), {"permission": "rewind"}),
    errors.Unauthenticated: (lambda: errors.Unauthenticated(), {}),
    errors.CursorExpired: (lambda: errors.CursorExpired(3, 10), {"oldest_cursor": "10"}),
    errors.SubscriberTooSlow: (lambda: errors.SubscriberTooSlow(42), {"last_cursor": "42"}),
    errors.StorageUnavailable: (lambda: errors.StorageUnavailable("database is locked"), {}),
    errors.FilesUnavailable: (lambda: errors.FilesUnavailable("No space left on device"), {}),
}


def _all_subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_all_subclasses(sub)}
    return found


def _domain_error_classes() -> set[type[AgentRewindError]]:
    return {
        c
        for c in _all_subclasses(AgentRewindError)
        if c.__module__ == errors.__name__ and inspect.getmodule(c) is errors
    }


def _details(status: status_pb2.Status) -> tuple[error_details_pb2.ErrorInfo, list[Any]]:
    infos, others = [], []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
        else:
            others.append(detail)
    assert len(infos) == 1, "exactly one ErrorInfo"
    return infos[0], others


def test_every_domain_error_class_has_a_sample_here() -> None:
    assert _domain_error_classes() == set(SAMPLES), "a new error class needs a row in SAMPLES"


def test_every_domain_reason_is_in_the_expected_table() -> None:
    reasons = {cls.reason for cls in _domain_error_classes()}
    assert reasons <= set(EXPECTED)


@pytest.mark.parametrize("cls", sorted(SAMPLES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_domain_error_maps_to_its_status_with_error_info(cls: type[AgentRewindError]) -> None:
    make, metadata = SAMPLES[cls]
    err = make()
    assert type(err) is cls
    status = to_status(err)
    assert status.code == EXPECTED[cls.reason], f"{cls.__name__} ({cls.reason})"
    assert status.message == err.message
    info, _ = _details(status)
    assert info.domain == "agent-rewind.v1" == DOMAIN
    assert info.reason == cls.reason
    assert dict(info.metadata) == metadata
    assert all(k == k.lower() and " " not in k for k in info.metadata)


@pytest.mark.parametrize("reason", sorted(API_TABLE))
def test_every_row_of_the_contract_table_has_a_domain_error_with_its_status(reason: str) -> None:
    classes = [c for c in SAMPLES if c.reason == reason]
    assert classes, f"no domain error class carries {reason}"
    for cls in classes:
        status = to_status(SAMPLES[cls][0]())
        assert status.code == API_TABLE[reason], cls.__name__
        info, _ = _details(status)
        assert (info.reason, info.domain) == (reason, DOMAIN)


def test_invalid_argument_carries_a_bad_request_naming_the_field() -> None:
    status = to_status(InvalidArgument("options.temperature", "is not a ClaudeAgentOptions field"))
    assert status.code == code_pb2.INVALID_ARGUMENT
    _, others = _details(status)
    assert len(others) == 1
    bad = error_details_pb2.BadRequest()
    assert others[0].Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("options.temperature", "is not a ClaudeAgentOptions field")
    ]


def test_a_path_outside_the_workspace_carries_a_bad_request_naming_paths() -> None:
    status = to_status(errors.PathOutsideWorkspace("/etc/passwd", "is absolute"))
    assert status.code == code_pb2.INVALID_ARGUMENT
    info, others = _details(status)
    assert info.reason == "PATH_OUTSIDE_WORKSPACE"
    bad = error_details_pb2.BadRequest()
    assert len(others) == 1 and others[0].Unpack(bad)
    assert [v.field for v in bad.field_violations] == ["paths"]
    assert "'/etc/passwd' is absolute" in bad.field_violations[0].description


def test_other_errors_carry_no_bad_request() -> None:
    _, others = _details(to_status(errors.SessionNotFound("s-1")))
    assert others == []


def test_an_unknown_reason_maps_to_internal() -> None:
    class Novel(AgentRewindError):
        reason = "SOMETHING_NOBODY_MAPPED"

    assert to_status(Novel("new")).code == code_pb2.INTERNAL


def test_the_base_error_is_internal() -> None:
    status = to_status(AgentRewindError("the turn failed unexpectedly"))
    assert status.code == code_pb2.INTERNAL
    info, _ = _details(status)
    assert info.reason == "INTERNAL"


def test_internal_status_has_no_stack_trace() -> None:
    try:
        raise RuntimeError("secret detail from deep inside")
    except RuntimeError:
        trace = traceback.format_exc()
        status = internal_status()
    assert status.code == code_pb2.INTERNAL
    assert "Traceback" not in status.message
    assert "secret detail" not in status.message
    assert 'File "' not in status.message
    assert status.message not in trace
    info, others = _details(status)
    assert (info.reason, info.domain) == ("INTERNAL", DOMAIN)
    assert others == []


class _Aborted(Exception):
    pass


class _Context:
    """The part of grpc.aio.ServicerContext the abort helpers use."""

    def __init__(self) -> None:
        self.status: Any = None

    async def abort_with_status(self, status: Any) -> None:
        self.status = status
        raise _Aborted


def _details_bin(status: Any) -> status_pb2.Status:
    metadata = dict(status.trailing_metadata)
    return status_pb2.Status.FromString(metadata["grpc-status-details-bin"])


async def test_abort_sends_the_status_with_its_details() -> None:
    context = _Context()
    with pytest.raises(_Aborted):
        await abort(context, errors.RewindConflict("old", "new"))  # type: ignore[arg-type]
    assert context.status.code == grpc.StatusCode.ABORTED
    info, _ = _details(_details_bin(context.status))
    assert info.reason == "REWIND_CONFLICT"
    assert info.metadata["last_message_id"] == "new"


async def test_abort_internal_sends_internal() -> None:
    context = _Context()
    with pytest.raises(_Aborted):
        await abort_internal(context)  # type: ignore[arg-type]
    assert context.status.code == grpc.StatusCode.INTERNAL
    info, _ = _details(_details_bin(context.status))
    assert info.reason == "INTERNAL"


def test_the_errors_page_lists_every_reason_with_the_status_served() -> None:
    page = (contract.ROOT / "docs" / "errors.md").read_text()
    rows = {reason: status for status, reason in re.findall(r"^\| `([A-Z_]+)` \| `([A-Z_]+)` \|", page, re.M)}
    assert rows.keys() == EXPECTED.keys(), "docs/errors.md must list exactly the reasons the service maps"
    wrong = {r: s for r, s in rows.items() if getattr(code_pb2, s) != EXPECTED[r]}
    assert not wrong, f"docs/errors.md gives another status than the service serves: {wrong}"


def test_every_reason_the_service_maps_says_what_to_do_next() -> None:
    """NEXT_STEPS is docs/errors.md's "what to do" column (`make docs`) and the CLI's hints."""
    assert NEXT_STEPS.keys() == STATUS_BY_REASON.keys()
    assert all(step.strip() for step in NEXT_STEPS.values())
