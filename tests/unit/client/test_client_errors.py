"""A failed RPC renders as `error: <STATUS> <REASON>: <message>` plus its details, never a traceback."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from agent_rewind.client import code_name, is_unreachable, render_rpc_error, render_status, status_from_error
from agent_rewind.client._errors import next_step
from agent_rewind.errors import NEXT_STEPS

DOMAIN = "agent-rewind.v1"


def packed(message: Any) -> any_pb2.Any:
    box = any_pb2.Any()
    box.Pack(message)
    return box


def make_status(code: int, message: str, *details: Any) -> status_pb2.Status:
    return status_pb2.Status(code=code, message=message, details=[packed(d) for d in details])


class FakeRpcError(grpc.RpcError):  # type: ignore[misc]
    """What a failed unary call raises: a grpc.RpcError that is also a grpc.Call."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: list[tuple[str, Any]] | None) -> None:
        super().__init__()
        self._code = code
        self._details = details
        self._trailing = trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> list[tuple[str, Any]] | None:
        return self._trailing


def test_reason_message_and_sorted_metadata() -> None:
    status = make_status(
        code_pb2.ABORTED,
        "expected_last_message_id 'a' is stale: the newest visible message is 'b'",
        error_details_pb2.ErrorInfo(
            reason="REWIND_CONFLICT",
            domain=DOMAIN,
            metadata={"last_message_id": "b", "expected_last_message_id": "a"},
        ),
    )
    assert render_status(status) == [
        "error: ABORTED REWIND_CONFLICT: expected_last_message_id 'a' is stale: the newest visible message is 'b'",
        "  expected_last_message_id: a",
        "  last_message_id: b",
        "hint: re-read, decide again, retry",
    ]


def test_a_refusal_ends_with_what_to_do_next_from_the_table_the_errors_page_shows() -> None:
    status = make_status(
        code_pb2.FAILED_PRECONDITION,
        "message 'p0' is the session's first prompt: there is no earlier message to resume the conversation at",
        error_details_pb2.ErrorInfo(
            reason="NO_CONVERSATION_ANCHOR", domain="agent-rewind.v1", metadata={"message_id": "p0"}
        ),
    )
    lines = render_status(status)
    assert lines[-1] == f"hint: {NEXT_STEPS['NO_CONVERSATION_ANCHOR']}"
    assert lines[-1] == "hint: rewind its files only (files mode), or start a new session"


def test_a_hints_links_to_other_pages_become_their_paths() -> None:
    assert "([events.md](events.md))" in NEXT_STEPS["CURSOR_EXPIRED"]
    assert next_step("CURSOR_EXPIRED") == NEXT_STEPS["CURSOR_EXPIRED"].replace(
        "([events.md](events.md))", "(docs/events.md)"
    )
    assert next_step("FILES_PRUNED").endswith("(docs/rewind.md)")
    assert next_step("NOT_A_REASON") is None


def test_bad_request_field_violations_follow_the_metadata() -> None:
    status = make_status(
        code_pb2.INVALID_ARGUMENT,
        "session_id: not a UUID",
        error_details_pb2.ErrorInfo(
            reason="INVALID_ARGUMENT", domain=DOMAIN, metadata={"field": "session_id"}
        ),
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field="session_id", description="not a UUID"),
                error_details_pb2.BadRequest.FieldViolation(field="page_size", description="at most 1000"),
            ]
        ),
    )
    assert render_status(status) == [
        "error: INVALID_ARGUMENT INVALID_ARGUMENT: session_id: not a UUID",
        "  field page_size: at most 1000",
        "hint: correct the field it names, and send the request again",
    ], "what the message says is not said again"


def test_a_field_error_is_said_once() -> None:
    status = make_status(
        code_pb2.INVALID_ARGUMENT,
        "options.max_turns: must be an integer from 1 to 100000",
        error_details_pb2.ErrorInfo(
            reason="INVALID_ARGUMENT", domain=DOMAIN, metadata={"field": "options.max_turns"}
        ),
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field="options.max_turns", description="must be an integer from 1 to 100000"
                )
            ]
        ),
    )
    assert render_status(status) == [
        "error: INVALID_ARGUMENT INVALID_ARGUMENT: options.max_turns: must be an integer from 1 to 100000",
        "hint: correct the field it names, and send the request again",
    ]


def test_metadata_a_violation_does_not_name_is_kept() -> None:
    status = make_status(
        code_pb2.INVALID_ARGUMENT,
        "two fields are wrong",
        error_details_pb2.ErrorInfo(reason="INVALID_ARGUMENT", domain=DOMAIN, metadata={"field": "cwd"}),
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field="page_size", description="too big")
            ]
        ),
    )
    assert render_status(status) == [
        "error: INVALID_ARGUMENT INVALID_ARGUMENT: two fields are wrong",
        "  field: cwd",
        "  field page_size: too big",
        "hint: correct the field it names, and send the request again",
    ]


def test_external_changes_names_the_command_line_flags() -> None:
    status = make_status(
        code_pb2.FAILED_PRECONDITION,
        "1 path(s) the rewind would restore were also changed outside the agent (notes.txt)",
        error_details_pb2.ErrorInfo(reason="EXTERNAL_CHANGES", domain=DOMAIN, metadata={"paths": "1"}),
    )
    lines = render_status(status)
    assert lines[-1].startswith("hint: see them with --dry-run")
    assert "--conflicts skip" in lines[-1] and "--conflicts overwrite" in lines[-1]


def test_revert_conflict_names_the_flags_and_what_each_keeps() -> None:
    status = make_status(
        code_pb2.FAILED_PRECONDITION,
        "1 file(s) the turn changed were changed since in the same lines, or as a whole (a.txt)",
        error_details_pb2.ErrorInfo(reason="REVERT_CONFLICT", domain=DOMAIN, metadata={"paths": "1"}),
    )
    lines = render_status(status)
    assert lines[:2] == [
        "error: FAILED_PRECONDITION REVERT_CONFLICT: 1 file(s) the turn changed were changed since in the "
        "same lines, or as a whole (a.txt)",
        "  paths: 1",
    ]
    assert lines[-1] == (
        "hint: see them with --dry-run (--diff for what the revert would apply), then revert with "
        "--conflicts skip (leave those files as they are) or --conflicts overwrite (put them back as "
        "they were before the turn; what changed since is lost)"
    )


def test_retry_info_is_shown_for_a_retryable_agent_failure() -> None:
    status = make_status(
        code_pb2.UNAVAILABLE,
        "the agent process died",
        error_details_pb2.ErrorInfo(reason="AGENT_UNAVAILABLE", domain=DOMAIN, metadata={"session_id": "s"}),
        error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1, nanos=500_000_000)),
    )
    assert not is_unreachable(status)
    assert render_status(status) == [
        "error: UNAVAILABLE AGENT_UNAVAILABLE: the agent process died",
        "  session_id: s",
        "  retry after 1.5s",
        "hint: retry: the next call resumes the session in a new process; the unknown-tools case needs the "
        "operator (move the SDK pin back, or teach `sessions/tools.py` the tool)",
    ]


def test_status_without_error_info_shows_the_code_alone() -> None:
    assert render_status(make_status(code_pb2.INTERNAL, "boom")) == ["error: INTERNAL: boom"]
    assert render_status(make_status(code_pb2.DEADLINE_EXCEEDED, "")) == ["error: DEADLINE_EXCEEDED"]


def test_unreachable_server_is_one_line_with_a_hint() -> None:
    status = make_status(code_pb2.UNAVAILABLE, "failed to connect to all addresses\nmore")
    assert is_unreachable(status)
    assert render_status(status, server="127.0.0.1:50051") == [
        "error: cannot reach agent-rewind at 127.0.0.1:50051 (failed to connect to all addresses); "
        "is the server running (`make run` in another terminal)?"
    ]


def test_code_names() -> None:
    assert code_name(5) == "NOT_FOUND"
    assert code_name(99) == "CODE_99"


def test_rpc_error_details_come_from_the_trailing_metadata() -> None:
    status = make_status(
        code_pb2.NOT_FOUND,
        "session 'x' not found",
        error_details_pb2.ErrorInfo(reason="SESSION_NOT_FOUND", domain=DOMAIN, metadata={"session_id": "x"}),
    )
    error = FakeRpcError(
        grpc.StatusCode.NOT_FOUND,
        "session 'x' not found",
        [("other", "v"), ("grpc-status-details-bin", status.SerializeToString())],
    )
    assert render_rpc_error(error) == [
        "error: NOT_FOUND SESSION_NOT_FOUND: session 'x' not found",
        "  session_id: x",
        "hint: check the id; `ListSessions`",
    ]


def test_rpc_error_whose_status_disagrees_with_the_header_still_renders_the_details() -> None:
    # grpc_status.rpc_status.from_call would raise ValueError here.
    status = make_status(
        code_pb2.NOT_FOUND, "from details", error_details_pb2.ErrorInfo(reason="MESSAGE_NOT_FOUND")
    )
    error = FakeRpcError(
        grpc.StatusCode.NOT_FOUND, "from header", [("grpc-status-details-bin", status.SerializeToString())]
    )
    assert render_rpc_error(error) == [
        "error: NOT_FOUND MESSAGE_NOT_FOUND: from details",
        "hint: `ListRewindPoints` again",
    ]


def test_rpc_error_without_details_uses_code_and_details() -> None:
    error = FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "no", None)
    assert status_from_error(error) == status_pb2.Status(code=code_pb2.FAILED_PRECONDITION, message="no")
    assert render_rpc_error(error) == ["error: FAILED_PRECONDITION: no"]


def test_undecodable_details_fall_back_to_code_and_details() -> None:
    error = FakeRpcError(grpc.StatusCode.INTERNAL, "x", [("grpc-status-details-bin", b"\xff\xff\xff")])
    assert render_rpc_error(error) == ["error: INTERNAL: x"]


AUTH_HINT = (
    "the service admits a token (--token-file FILE or $AGENT_REWIND_TOKEN) or a client certificate "
    "(--tls-cert/--tls-key) that its access file lists"
)


def test_unauthenticated_is_one_line_naming_the_status_once_with_a_hint() -> None:
    status = make_status(
        code_pb2.UNAUTHENTICATED,
        "the bearer token is not valid",
        error_details_pb2.ErrorInfo(reason="UNAUTHENTICATED", domain=DOMAIN),
    )
    assert render_status(status) == [f"error: UNAUTHENTICATED: the bearer token is not valid; {AUTH_HINT}"]
    # Without details (refused by something before the service), the same line.
    error = FakeRpcError(grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not valid", None)
    assert render_rpc_error(error) == render_status(status)


def test_permission_denied_is_one_line_without_its_metadata() -> None:
    status = make_status(
        code_pb2.PERMISSION_DENIED,
        "this call needs the permission 'rewind', which the caller lacks",
        error_details_pb2.ErrorInfo(
            reason="PERMISSION_DENIED", domain=DOMAIN, metadata={"permission": "rewind"}
        ),
    )
    assert render_status(status) == [
        "error: PERMISSION_DENIED: this call needs the permission 'rewind', which the caller lacks; "
        "ask the service's operator to grant it in the access file"
    ]


def test_an_auth_refusal_with_another_reason_keeps_it() -> None:
    status = make_status(
        code_pb2.PERMISSION_DENIED,
        "quota",
        error_details_pb2.ErrorInfo(reason="PRINCIPAL_LOCKED", domain=DOMAIN),
    )
    (line,) = render_status(status)
    assert line.startswith("error: PERMISSION_DENIED PRINCIPAL_LOCKED: quota; ")


@pytest.mark.parametrize(
    ("message", "tls", "hint"),
    [
        (
            "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED",
            True,
            "the server's certificate is not signed by a trusted CA: pass the CA that signed it with --tls-ca",
        ),
        (
            "Custom verification check failed with error: UNAUTHENTICATED: Hostname Verification Check failed.",
            True,
            "the server's certificate does not name the host of --server",
        ),
        (
            "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: WRONG_VERSION_NUMBER",
            True,
            "the server does not speak TLS: call it without --tls-ca, --tls-cert/--tls-key or $AGENT_REWIND_TLS_*",
        ),
        (
            "Socket closed",
            True,
            "the server closed the connection in the TLS handshake: does it want a client certificate "
            "(--tls-cert/--tls-key) signed by a CA it trusts?",
        ),
        (
            "Socket closed",
            False,
            "the server closed the connection: if it serves TLS, pass --tls-ca (and --tls-cert/--tls-key for "
            "mutual TLS); else is the server running (`make run` in another terminal)?",
        ),
        (
            "Connection refused",
            True,
            "is the server running (`make run` in another terminal)?",
        ),
    ],
)
def test_a_failed_tls_handshake_gets_a_hint_about_tls(message: str, tls: bool, hint: str) -> None:
    first = f"failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: {message}"
    (line,) = render_status(make_status(code_pb2.UNAVAILABLE, first), server="127.0.0.1:1", tls=tls)
    assert line == f"error: cannot reach agent-rewind at 127.0.0.1:1 ({first}); {hint}"
