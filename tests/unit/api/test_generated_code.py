"""The committed generated code matches protos/, and the protos keep every name API.md fixes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor

# Imported for their side effect: they register every agent_rewind.v1 descriptor.
from agent_rewind.api.v1 import error_reason_pb2, rewind_service_pb2, session_service_pb2
from agent_rewind.rpc.errors import STATUS_BY_REASON
from tests import contract

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "src" / "agent_rewind" / "api" / "v1"
PACKAGE = "agent_rewind.v1"


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


def test_the_node_clients_copy_of_the_protos_is_up_to_date(tmp_path: Path) -> None:
    # clients/node ships this copy in its package (no install script makes it).
    _gen_protos().copy_protos(tmp_path)
    committed = ROOT / "clients" / "node" / "protos"
    fresh = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    copied = {str(p.relative_to(committed)): p.read_text() for p in committed.rglob("*") if p.is_file()}
    assert fresh, "protos/ has no .proto files"
    assert copied == fresh, (
        "clients/node/protos differs from protos/; run `make proto` and commit the result: "
        f"missing {sorted(fresh.keys() - copied.keys())}, not in protos/ {sorted(copied.keys() - fresh.keys())}, "
        f"differs {sorted(k for k in fresh.keys() & copied.keys() if fresh[k] != copied[k])}"
    )


# --- The names API.md fixes --------------------------------------------------------------------

# The services API.md defines; every RPC signature it writes lives on one of them.
SERVICES = ("SessionService", "RewindService")
# Types the contract names without their package.
_WELL_KNOWN = {"Empty": "google.protobuf.Empty"}


def _full(name: str) -> str:
    return _WELL_KNOWN.get(name, f"{PACKAGE}.{name}")


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
    # Round 2 additions.
    "WatchRewindEventsResponse": {"event": "agent_rewind.v1.RewindEvent", "caught_up": None},
    "WatchRewindEventsResponse.caught_up": {"cursor": "uint64"},
    "CloseSessionRequest": {"session_id": "string", "force": "bool"},
    "RewindResult.files.conflicts": {"path": "string"},
    "RewindResult.files.diffs": {
        "path": "string",
        "change": None,
        "unified_diff": "string",
        "binary": "bool",
    },
    "UndoRewindRequest": {
        "session_id": "string",
        "rewind_id": "string",
        "request_id": "string",
        "conflict_policy": "agent_rewind.v1.ConflictPolicy",
        "validate_only": "bool",
    },
    "PromptRewind": {
        "message_id": "string",
        "mode": "agent_rewind.v1.RewindMode",
        "expected_last_message_id": "optional string",
        "conflict_policy": "agent_rewind.v1.ConflictPolicy",
    },
    "ForkSessionRequest": {
        "session_id": "string",
        "message_id": "string",
        "new_session_id": "string",
        "cwd": "string",
        "request_id": "string",
    },
    "DeleteSessionRequest": {"session_id": "string", "request_id": "string", "delete_workspace": "bool"},
}
# Fields of the round 1 messages that Round 2 adds.
for _message_name, _fields in {
    "CreateSessionRequest": {"workspace_snapshots": "optional bool"},
    "PromptRequest": {"rewind": "agent_rewind.v1.PromptRewind"},
    "Session": {"principal": "string", "replica": "string"},
    "RewindRequest": {"conflict_policy": "agent_rewind.v1.ConflictPolicy", "include_diff": "bool"},
    "RewindResult.files": {
        "source": "agent_rewind.v1.FilesSource",
        "conflicts": "repeated agent_rewind.v1.FileConflict",
        "diffs": "repeated agent_rewind.v1.FileDiff",
    },
    "RewindPoint": {"snapshot_available": "bool"},
    "RewindEvent": {"kind": "agent_rewind.v1.RewindEventKind"},
    "Capabilities": {"replicas": None},
}.items():
    API_FIELDS[_message_name] = {**API_FIELDS[_message_name], **_fields}
# Round 3 additions.
API_FIELDS["Capabilities.sandbox"] = {"enabled": "bool", "allowed_hosts": "repeated string"}
API_FIELDS["RewindResult.side_effects"] = {"message_id": "string", "tool": "string", "summary": "string"}
API_FIELDS["Session.forked_from"] = {"session_id": "string", "message_id": "string"}
for _message_name, _fields in {
    "Capabilities": {"sandbox": "agent_rewind.v1.SandboxCapability"},
    "RewindPoint": {"compacted": "bool"},
    "RewindResult": {"side_effects": "repeated agent_rewind.v1.SideEffect"},
    "Session": {"forked_from": "agent_rewind.v1.ForkOrigin"},
}.items():
    API_FIELDS[_message_name] = {**API_FIELDS[_message_name], **_fields}

# enum -> the values API.md fixes (each enum also has its _UNSPECIFIED zero value).
API_ENUMS: dict[str, set[str]] = {
    "RewindMode": {"REWIND_MODE_FILES", "REWIND_MODE_CONVERSATION", "REWIND_MODE_BOTH"},
    "RewindEventKind": {
        "REWIND_EVENT_KIND_REWOUND",
        "REWIND_EVENT_KIND_UNDONE",
        "REWIND_EVENT_KIND_SESSION_DELETED",
    },
    "FilesSource": {"FILES_SOURCE_CHECKPOINT", "FILES_SOURCE_SNAPSHOT"},
    "ConflictPolicy": {"CONFLICT_POLICY_REFUSE", "CONFLICT_POLICY_SKIP", "CONFLICT_POLICY_OVERWRITE"},
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
    ) >= set(SERVICES)


def _methods() -> dict[str, MethodDescriptor]:
    found: dict[str, MethodDescriptor] = {}
    for service in SERVICES:
        for method in _service(service).methods:
            assert method.name not in found, f"{method.name} is on two services"
            found[method.name] = method
    return found


@pytest.mark.parametrize("rpc", sorted(contract.rpc_signatures()))
def test_every_rpc_the_contract_writes_has_its_signature(rpc: str) -> None:
    request, response, streams = contract.rpc_signatures()[rpc]
    method = _methods().get(rpc)
    assert method is not None, f"{rpc} is missing from {SERVICES}"
    got = (method.input_type.full_name, method.output_type.full_name, method.server_streaming)
    assert got == (_full(request), _full(response), streams), rpc
    assert not method.client_streaming, f"{rpc} must not take a client stream"


def test_rpcs_the_contract_does_not_fix_use_their_own_request_and_response() -> None:
    # buf.yaml exempts the service files from the RPC naming rules for API.md's signatures;
    # this keeps those rules for any RPC added later.
    fixed = contract.rpc_signatures()
    for name, method in _methods().items():
        if name in fixed:
            continue
        assert method.input_type.name == f"{name}Request", method.full_name
        assert method.output_type.name == f"{name}Response", method.full_name


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


@pytest.mark.parametrize("enum", sorted(API_ENUMS))
def test_enum_has_exactly_the_api_md_values_with_unspecified_zero(enum: str) -> None:
    values = {v.name: v.number for v in _pool().FindEnumTypeByName(f"{PACKAGE}.{enum}").values}
    unspecified = re.sub(r"(?<!^)(?=[A-Z])", "_", enum).upper() + "_UNSPECIFIED"
    assert values.keys() == API_ENUMS[enum] | {unspecified}
    assert values[unspecified] == 0


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


def test_error_reason_values_are_exactly_the_reasons_the_service_maps() -> None:
    values = _error_reasons()
    assert values.get("ERROR_REASON_UNSPECIFIED") == 0
    names = values.keys() - {"ERROR_REASON_UNSPECIFIED"}
    assert names == STATUS_BY_REASON.keys(), (
        f"only in ErrorReason: {sorted(names - STATUS_BY_REASON.keys())}; "
        f"only in STATUS_BY_REASON: {sorted(STATUS_BY_REASON.keys() - names)}"
    )


def test_the_repository_copy_of_the_contract_is_the_contract() -> None:
    if not contract.SHARED.is_file():
        pytest.skip(f"the design docs are not beside the repo ({contract.SHARED}); nothing to compare")
    assert contract.VENDORED.read_text() == contract.SHARED.read_text(), (
        f"{contract.VENDORED.relative_to(ROOT)} differs from {contract.SHARED}: copy the contract again"
    )


def test_error_reason_has_every_reason_in_the_contracts_errors_table() -> None:
    table = contract.error_table()
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
