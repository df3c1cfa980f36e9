"""The committed generated code matches protos/, and the protos keep every name API.md fixes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor

# Imported for their side effect: they register every agent_rewind.v1 descriptor.
from agent_rewind.api.v1 import error_reason_pb2, rewind_service_pb2, session_service_pb2
from agent_rewind.rpc.errors import STATUS_BY_REASON

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "src" / "agent_rewind" / "api" / "v1"
PACKAGE = "agent_rewind.v1"
# The design docs sit beside the clone (CI checks out ../shared too).
API_MD = ROOT.parent / "shared" / "design" / "API.md"


def _gen_protos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir()) if p.suffix in (".py", ".pyi")}


def test_committed_generated_code_is_up_to_date_with_protos(tmp_path: Path) -> None:
    _gen_protos().generate(tmp_path)
    fresh, committed = _sources(tmp_path), _sources(COMMITTED)

    problems = [f"missing: {n}" for n in sorted(fresh.keys() - committed.keys())]
    problems += [f"not generated from any proto: {n}" for n in sorted(committed.keys() - fresh.keys())]
    problems += [f"differs: {n}" for n in sorted(fresh.keys() & committed.keys()) if fresh[n] != committed[n]]
    assert not problems, (
        "src/agent_rewind/api/v1 is out of date with protos/; run `make proto` and commit the result:\n  "
        + "\n  ".join(problems)
    )


# --- The names API.md fixes --------------------------------------------------------------------

# service -> rpc -> (request, response, response is a stream)
API_RPCS: dict[str, dict[str, tuple[str, str, bool]]] = {
    "SessionService": {
        "CreateSession": ("CreateSessionRequest", "Session", False),
        "GetSession": ("GetSessionRequest", "Session", False),
        "ListSessions": ("ListSessionsRequest", "ListSessionsResponse", False),
        "Prompt": ("PromptRequest", "TurnEvent", True),
        "Interrupt": ("InterruptRequest", "Session", False),
        "CloseSession": ("CloseSessionRequest", "Session", False),
    },
    "RewindService": {
        "GetCapabilities": ("GetCapabilitiesRequest", "Capabilities", False),
        "ListRewindPoints": ("ListRewindPointsRequest", "ListRewindPointsResponse", False),
        "DryRun": ("RewindRequest", "RewindResult", False),
        "Rewind": ("RewindRequest", "RewindResult", False),
        "WatchRewindEvents": ("WatchRewindEventsRequest", "RewindEvent", True),
    },
}

# message -> field -> its kind as _kind() renders it, or None where API.md fixes only the name.
# A message named with a dot is reached through a field: "RewindResult.files" is the message
# type of RewindResult's `files` field, whatever the implementer named it.
API_FIELDS: dict[str, dict[str, str | None]] = {
    "CreateSessionRequest": {
        "cwd": "string",
        "session_id": "string",
        "options": "google.protobuf.Struct",
        "enable_file_checkpointing": "optional bool",
        "request_id": "string",
    },
    "Session": {
        "session_id": "string",
        "cwd": "string",
        "state": None,
        "last_message_id": "string",
        "turn_count": None,
        "file_checkpointing": "bool",
        "create_time": "google.protobuf.Timestamp",
        "update_time": "google.protobuf.Timestamp",
    },
    "ListSessionsRequest": {"page_size": None, "page_token": "string"},
    "ListSessionsResponse": {"sessions": "repeated agent_rewind.v1.Session", "next_page_token": "string"},
    "PromptRequest": {"session_id": "string", "text": "string", "request_id": "string"},
    "TurnEvent": {"message_id": "string"},
    "Capabilities": {
        "modes": "repeated agent_rewind.v1.RewindMode",
        "file_checkpoint_window": None,
        "dry_run": "bool",
        "events": "bool",
    },
    "ListRewindPointsRequest": {"session_id": "string", "page_size": None, "page_token": "string"},
    "ListRewindPointsResponse": {
        "points": "repeated agent_rewind.v1.RewindPoint",
        "next_page_token": "string",
        "last_message_id": "string",
    },
    "RewindPoint": {
        "message_id": "string",
        "resume_at_message_id": "string",
        "text": "string",
        "index": None,
        "create_time": "google.protobuf.Timestamp",
        "files_rewindable": "bool",
    },
    "RewindRequest": {
        "session_id": "string",
        "message_id": "string",
        "mode": "agent_rewind.v1.RewindMode",
        "expected_last_message_id": "optional string",
        "request_id": "string",
    },
    "RewindResult": {"rewind_id": "string", "files": None, "conversation": None, "last_message_id": "string"},
    "RewindResult.files": {
        "can_rewind": "bool",
        "files_changed": None,
        "insertions": None,
        "deletions": None,
        "skipped_links": None,
        "refusal": None,
    },
    "RewindResult.conversation": {
        "can_rewind": "bool",
        "rewound": "bool",
        "messages_dropped": None,
        "refusal": None,
    },
    "RewindEvent": {
        "cursor": "uint64",
        "rewind_id": "string",
        "session_id": "string",
        "message_id": "string",
        "mode": "agent_rewind.v1.RewindMode",
        "messages_dropped": None,
        "principal": "string",
        "occur_time": "google.protobuf.Timestamp",
    },
    "WatchRewindEventsRequest": {"session_id": "string", "after_cursor": "optional uint64"},
}

_SCALARS = {
    getattr(FieldDescriptor, name): name.removeprefix("TYPE_").lower()
    for name in dir(FieldDescriptor)
    if name.startswith("TYPE_") and name not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}


def _kind(field: FieldDescriptor) -> str:
    """A field's type as written in a .proto: "optional uint64", "repeated agent_rewind.v1.RewindMode"."""
    if field.message_type is not None:
        base = field.message_type.full_name
    elif field.enum_type is not None:
        base = field.enum_type.full_name
    else:
        base = _SCALARS[field.type]
    if field.is_repeated:
        return f"repeated {base}"
    # proto3 `optional` puts a scalar in a synthetic oneof of its own; members of real oneofs
    # also have presence but are not `optional`.
    oneof = field.containing_oneof
    if field.type != FieldDescriptor.TYPE_MESSAGE and oneof is not None and oneof.name == f"_{field.name}":
        return f"optional {base}"
    return base


def _pool() -> descriptor_pool.DescriptorPool:
    return descriptor_pool.Default()


def _message(name: str) -> Descriptor:
    head, *path = name.split(".")
    message = _pool().FindMessageTypeByName(f"{PACKAGE}.{head}")
    for field_name in path:
        field = message.fields_by_name[field_name]
        assert field.message_type is not None, f"{message.name}.{field_name} is not a message"
        message = field.message_type
    return message


def _service(name: str) -> ServiceDescriptor:
    return _pool().FindServiceByName(f"{PACKAGE}.{name}")


def test_services_live_in_the_package_named_by_their_directory() -> None:
    for module in (session_service_pb2, rewind_service_pb2):
        assert module.DESCRIPTOR.package == PACKAGE
        assert module.DESCRIPTOR.name.startswith("agent_rewind/v1/")
    assert set(session_service_pb2.DESCRIPTOR.services_by_name) | set(
        rewind_service_pb2.DESCRIPTOR.services_by_name
    ) >= set(API_RPCS)


@pytest.mark.parametrize("service", sorted(API_RPCS))
def test_service_has_the_rpcs_api_md_fixes(service: str) -> None:
    methods = {m.name: m for m in _service(service).methods}
    for rpc, (request, response, streams) in API_RPCS[service].items():
        assert rpc in methods, f"{service}.{rpc} is missing"
        method = methods[rpc]
        got = (method.input_type.full_name, method.output_type.full_name, method.server_streaming)
        assert got == (f"{PACKAGE}.{request}", f"{PACKAGE}.{response}", streams), f"{service}.{rpc}"
        assert not method.client_streaming, f"{service}.{rpc} must not take a client stream"


@pytest.mark.parametrize("service", sorted(API_RPCS))
def test_rpcs_api_md_does_not_fix_use_their_own_request_and_response(service: str) -> None:
    # buf.yaml exempts the service files from the RPC naming rules for API.md's signatures;
    # this keeps those rules for any RPC added later.
    for method in _service(service).methods:
        if method.name in API_RPCS[service]:
            continue
        assert method.input_type.name == f"{method.name}Request", method.full_name
        assert method.output_type.name == f"{method.name}Response", method.full_name


@pytest.mark.parametrize("message", sorted(API_FIELDS))
def test_message_has_the_fields_api_md_fixes(message: str) -> None:
    fields = _message(message).fields_by_name
    missing = sorted(set(API_FIELDS[message]) - set(fields))
    assert not missing, f"{message} lacks {missing}"
    wrong = {
        name: _kind(fields[name])
        for name, kind in API_FIELDS[message].items()
        if kind is not None and _kind(fields[name]) != kind
    }
    assert not wrong, f"{message}: fields of the wrong kind {wrong}"


def test_rewind_mode_has_exactly_the_api_md_values_with_unspecified_zero() -> None:
    values = {v.name: v.number for v in _pool().FindEnumTypeByName(f"{PACKAGE}.RewindMode").values}
    assert values.keys() == {
        "REWIND_MODE_UNSPECIFIED",
        "REWIND_MODE_FILES",
        "REWIND_MODE_CONVERSATION",
        "REWIND_MODE_BOTH",
    }
    assert values["REWIND_MODE_UNSPECIFIED"] == 0


def test_session_state_has_the_api_md_states() -> None:
    state = _message("Session").fields_by_name["state"]
    assert state.enum_type is not None, "Session.state must be an enum"
    values = {v.name: v.number for v in state.enum_type.values}
    prefix = "SESSION_STATE_"
    assert {f"{prefix}{s}" for s in ("IDLE", "RUNNING", "HIBERNATED", "CLOSED")} <= values.keys()
    assert values[f"{prefix}UNSPECIFIED"] == 0


# --- Error reasons -----------------------------------------------------------------------------


def _error_reasons() -> dict[str, int]:
    enum = _pool().FindEnumTypeByName(f"{PACKAGE}.ErrorReason")
    assert enum.file.name == error_reason_pb2.DESCRIPTOR.name
    return {v.name: v.number for v in enum.values}


# API.md's Errors table, reason -> status. When the design docs are checked out beside the repo
# (../shared, as in CI) the table is read from API.md itself, and this copy must match it.
CONTRACT_ERRORS = {
    "SESSION_NOT_FOUND": "NOT_FOUND",
    "MESSAGE_NOT_FOUND": "NOT_FOUND",
    "NOT_A_REWIND_POINT": "INVALID_ARGUMENT",
    "INVALID_ARGUMENT": "INVALID_ARGUMENT",
    "TURN_IN_FLIGHT": "FAILED_PRECONDITION",
    "NO_CONVERSATION_ANCHOR": "FAILED_PRECONDITION",
    "FILE_CHECKPOINT_UNAVAILABLE": "FAILED_PRECONDITION",
    "CHECKPOINTING_DISABLED": "FAILED_PRECONDITION",
    "REWIND_CONFLICT": "ABORTED",
    "REQUEST_ID_REUSED": "INVALID_ARGUMENT",
    "PERMISSION_DENIED": "PERMISSION_DENIED",
    "UNAUTHENTICATED": "UNAUTHENTICATED",
    "WORKSPACE_OUTSIDE_ROOT": "INVALID_ARGUMENT",
    "AGENT_UNAVAILABLE": "UNAVAILABLE",
    "CURSOR_EXPIRED": "OUT_OF_RANGE",
    "SUBSCRIBER_TOO_SLOW": "RESOURCE_EXHAUSTED",
}


def _api_md_error_table() -> dict[str, str]:
    """reason -> status, from the rows of API.md's Errors table (| `STATUS` | `REASON` | when |)."""
    if not API_MD.is_file():
        return CONTRACT_ERRORS
    rows = re.findall(r"^\|\s*`([A-Z_]+)`\s*\|\s*`([A-Z_]+)`\s*\|", API_MD.read_text(), re.MULTILINE)
    assert rows, f"no error rows (| `STATUS` | `REASON` | when |) found in {API_MD}"
    return {reason: status for status, reason in rows}


def test_error_reason_values_are_exactly_the_reasons_the_service_maps() -> None:
    values = _error_reasons()
    assert values.get("ERROR_REASON_UNSPECIFIED") == 0
    names = values.keys() - {"ERROR_REASON_UNSPECIFIED"}
    assert names == STATUS_BY_REASON.keys(), (
        f"only in ErrorReason: {sorted(names - STATUS_BY_REASON.keys())}; "
        f"only in STATUS_BY_REASON: {sorted(STATUS_BY_REASON.keys() - names)}"
    )


def test_error_reason_has_every_reason_in_api_md_errors_table() -> None:
    table = _api_md_error_table()
    assert table == CONTRACT_ERRORS, "API.md's Errors table changed: update CONTRACT_ERRORS and the protos"
    missing = sorted(table.keys() - _error_reasons().keys())
    assert not missing, f"API.md's Errors table has reasons ErrorReason lacks: {missing}"
    wrong = {r: (s, STATUS_BY_REASON[r].name) for r, s in table.items() if STATUS_BY_REASON[r].name != s}
    assert not wrong, f"reasons mapped to another status than API.md names: {wrong}"


def test_error_reason_comments_name_the_status_the_service_returns() -> None:
    # Each value's comment opens with its status code ("// NOT_FOUND. ..."), as clients read it.
    text = (ROOT / "protos" / "agent_rewind" / "v1" / "error_reason.proto").read_text()
    documented = {
        name: status for status, name in re.findall(r"// ([A-Z_]+)\.[^=]*?\n  ([A-Z_]+) = \d+;", text)
    }
    wrong = {
        reason: (documented.get(reason), code.name)
        for reason, code in STATUS_BY_REASON.items()
        if documented.get(reason) != code.name
    }
    assert not wrong, f"reason: (status in error_reason.proto's comment, status served) {wrong}"
