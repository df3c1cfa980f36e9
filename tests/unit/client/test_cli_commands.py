"""`agent-rewind` client commands end to end against an in-process gRPC server with canned answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from agent_rewind.api.v1 import (
    rewind_pb2,
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.cli import main

SID = "11111111-2222-3333-4444-555555555555"


def abort(context: Any, code: int, message: str, reason: str, metadata: dict[str, str]) -> None:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="agent-rewind.v1", metadata=metadata))
    context.abort_with_status(
        rpc_status.to_status(status_pb2.Status(code=code, message=message, details=[detail]))
    )


class Sessions(session_service_pb2_grpc.SessionServiceServicer):
    def __init__(self) -> None:
        self.requests: list[Any] = []

    def CreateSession(self, request: Any, context: Any) -> session_pb2.Session:  # noqa: N802
        self.requests.append(request)
        return session_pb2.Session(
            session_id=request.session_id or SID,
            cwd=request.cwd,
            state=session_pb2.SESSION_STATE_IDLE,
            file_checkpointing=request.enable_file_checkpointing
            if request.HasField("enable_file_checkpointing")
            else True,
            options=request.options,
        )

    def GetSession(self, request: Any, context: Any) -> session_pb2.Session:  # noqa: N802
        abort(
            context,
            code_pb2.NOT_FOUND,
            f"session {request.session_id!r} not found",
            "SESSION_NOT_FOUND",
            {"session_id": request.session_id},
        )
        raise AssertionError("unreachable")

    def ListSessions(self, request: Any, context: Any) -> session_service_pb2.ListSessionsResponse:  # noqa: N802
        self.requests.append(request)
        if not request.page_token:
            return session_service_pb2.ListSessionsResponse(
                sessions=[session_pb2.Session(session_id="s1", state=session_pb2.SESSION_STATE_IDLE)],
                next_page_token="page2",
            )
        return session_service_pb2.ListSessionsResponse(
            sessions=[session_pb2.Session(session_id="s2", state=session_pb2.SESSION_STATE_CLOSED)]
        )

    def Prompt(self, request: Any, context: Any) -> Iterator[session_pb2.TurnEvent]:  # noqa: N802
        self.requests.append(request)
        yield session_pb2.TurnEvent(
            session_id=request.session_id,
            message_id="u-1",
            user_prompt=session_pb2.UserPrompt(text=request.text),
        )
        yield session_pb2.TurnEvent(
            session_id=request.session_id,
            message_id="a-1",
            assistant_message=session_pb2.AssistantMessage(api_message_id="msg_1", text="hello"),
        )
        if request.text == "fail":
            abort(context, code_pb2.UNAVAILABLE, "the agent died", "AGENT_UNAVAILABLE", {"session_id": SID})
        yield session_pb2.TurnEvent(
            session_id=request.session_id,
            result=session_pb2.TurnResult(subtype="success", num_turns=1, duration_ms=20),
        )

    def Interrupt(self, request: Any, context: Any) -> session_pb2.Session:  # noqa: N802
        self.requests.append(request)
        return session_pb2.Session(session_id=request.session_id, state=session_pb2.SESSION_STATE_IDLE)

    def CloseSession(self, request: Any, context: Any) -> session_pb2.Session:  # noqa: N802
        self.requests.append(request)
        return session_pb2.Session(session_id=request.session_id, state=session_pb2.SESSION_STATE_CLOSED)


class Rewinds(rewind_service_pb2_grpc.RewindServiceServicer):
    def __init__(self) -> None:
        self.requests: list[Any] = []

    def GetCapabilities(self, request: Any, context: Any) -> rewind_pb2.Capabilities:  # noqa: N802
        return rewind_pb2.Capabilities(modes=[rewind_pb2.REWIND_MODE_BOTH], dry_run=True)

    def ListRewindPoints(self, request: Any, context: Any) -> rewind_service_pb2.ListRewindPointsResponse:  # noqa: N802
        self.requests.append(request)
        return rewind_service_pb2.ListRewindPointsResponse(
            points=[rewind_pb2.RewindPoint(message_id="p0", text="hi", files_rewindable=True)],
            last_message_id="last-1",
        )

    def DryRun(self, request: Any, context: Any) -> rewind_pb2.RewindResult:  # noqa: N802
        self.requests.append(("DryRun", request))
        return rewind_pb2.RewindResult(
            files=rewind_pb2.FilesRewindResult(can_rewind=True, requested=True), last_message_id="last-1"
        )

    def Rewind(self, request: Any, context: Any) -> rewind_pb2.RewindResult:  # noqa: N802
        self.requests.append(("Rewind", request))
        abort(
            context,
            code_pb2.ABORTED,
            "expected_last_message_id is stale",
            "REWIND_CONFLICT",
            {"last_message_id": "last-2"},
        )
        raise AssertionError("unreachable")

    def WatchRewindEvents(self, request: Any, context: Any) -> Iterator[rewind_pb2.RewindEvent]:  # noqa: N802
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in this fake")
        yield rewind_pb2.RewindEvent()


@pytest.fixture
def server() -> Iterator[tuple[str, Sessions, Rewinds]]:
    sessions, rewinds = Sessions(), Rewinds()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    session_service_pb2_grpc.add_SessionServiceServicer_to_server(sessions, grpc_server)
    rewind_service_pb2_grpc.add_RewindServiceServicer_to_server(rewinds, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        yield f"127.0.0.1:{port}", sessions, rewinds
    finally:
        grpc_server.stop(None)


def test_session_create_sends_options_checkpointing_and_an_absolute_cwd(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, sessions, _ = server
    code = main(
        [
            "--server",
            address,
            "session",
            "create",
            "--cwd",
            "/tmp/w",
            "--no-checkpointing",
            "--option",
            "max_turns=3",
            "--options-json",
            '{"model": "m"}',
        ]
    )
    assert code == 0
    (request,) = sessions.requests
    assert request.cwd == "/tmp/w"
    assert request.HasField("enable_file_checkpointing") and not request.enable_file_checkpointing
    assert dict(request.options) == {"model": "m", "max_turns": 3.0}
    out = capsys.readouterr().out
    assert f"session_id          {SID}\n" in out
    assert "file_checkpointing  no\n" in out


def test_session_create_leaves_checkpointing_to_the_server_default(
    server: tuple[str, Sessions, Rewinds],
) -> None:
    address, sessions, _ = server
    assert main(["--server", address, "session", "create"]) == 0
    assert not sessions.requests[0].HasField("enable_file_checkpointing")
    assert sessions.requests[0].cwd == ""


def test_session_list_all_follows_every_page(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, sessions, _ = server
    assert main(["session", "list", "--all", "--page-size", "1", "--server", address, "--json"]) == 0
    assert [r.page_token for r in sessions.requests] == ["", "page2"]
    assert [r.page_size for r in sessions.requests] == [1, 1]
    listing = json.loads(capsys.readouterr().out)
    assert [s["session_id"] for s in listing["sessions"]] == ["s1", "s2"]
    assert listing["next_page_token"] == ""


def test_session_list_one_page_says_how_to_get_more(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, _ = server
    assert main(["--server", address, "session", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "more: --page-token page2 (or --all)"


def test_prompt_sends_the_request_id_given(server: tuple[str, Sessions, Rewinds]) -> None:
    address, sessions, _ = server
    request_id = "0b7e7c52-4d9e-4f55-9a39-2f1f5c3b8a10"
    assert main(["--server", address, "prompt", SID, "say hello", "--request-id", request_id]) == 0
    assert main(["--server", address, "prompt", "--request-id", request_id, SID, "say hello"]) == 0
    assert [r.request_id for r in sessions.requests] == [request_id, request_id]


def test_prompt_without_a_request_id_sends_a_fresh_one_each_time(
    server: tuple[str, Sessions, Rewinds],
) -> None:
    address, sessions, _ = server
    assert main(["--server", address, "prompt", SID, "say hello"]) == 0
    assert main(["--server", address, "prompt", SID, "say hello"]) == 0
    first, second = (r.request_id for r in sessions.requests)
    assert first and second and first != second


def test_prompt_streams_each_event_on_its_line(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, sessions, _ = server
    assert main(["--server", address, "prompt", SID, "say hello"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "› prompt u-1  say hello",  # noqa: RUF001
        "● hello",
        "✓ result success · 1 turn · 20ms · $0.0000",
    ]
    assert sessions.requests[0].request_id  # a fresh one for tracing


def test_an_error_mid_stream_keeps_what_was_printed_and_exits_1(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, _ = server
    assert main(["--server", address, "prompt", SID, "fail"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["› prompt u-1  fail", "● hello"]  # noqa: RUF001
    assert captured.err.splitlines() == [
        "error: UNAVAILABLE AGENT_UNAVAILABLE: the agent died",
        f"  session_id: {SID}",
    ]


def test_not_found_exits_1_with_the_reason_on_stderr(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, _ = server
    assert main(["--server", address, "session", "show", "nope"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "error: NOT_FOUND SESSION_NOT_FOUND: session 'nope' not found",
        "  session_id: nope",
    ]


def test_points_table_and_footer(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    assert main(["--server", address, "points", SID, "--page-size", "5"]) == 0
    assert rewinds.requests[0].page_size == 5
    assert capsys.readouterr().out.splitlines() == [
        "#  MESSAGE_ID  RESUME_AT  FILES  CREATED  TEXT",
        "0  p0          -          yes    -        hi",
        "last_message_id: last-1",
    ]


def test_dry_run_calls_dry_run_with_the_mode(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    assert main(["--server", address, "rewind", SID, "p0", "--mode", "files", "--dry-run"]) == 0
    ((method, request),) = rewinds.requests
    assert method == "DryRun"
    assert request.mode == rewind_pb2.REWIND_MODE_FILES
    assert not request.HasField("expected_last_message_id")
    assert "rewind_id        - (dry run: nothing was applied)" in capsys.readouterr().out


def test_rewind_conflict_shows_the_actual_last_message(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    argv = [
        "--server",
        address,
        "rewind",
        SID,
        "p0",
        "--mode",
        "both",
        "--expect-last",
        "old",
        "--request-id",
        "r1",
    ]
    assert main(argv) == 1
    ((method, request),) = rewinds.requests
    assert method == "Rewind"
    assert (request.mode, request.expected_last_message_id, request.request_id) == (
        rewind_pb2.REWIND_MODE_BOTH,
        "old",
        "r1",
    )
    assert capsys.readouterr().err.splitlines() == [
        "error: ABORTED REWIND_CONFLICT: expected_last_message_id is stale",
        "  last_message_id: last-2",
    ]


@pytest.mark.parametrize(("action", "state"), [("interrupt", "IDLE"), ("close", "CLOSED")])
def test_interrupt_and_close_print_the_session(
    action: str, state: str, server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, sessions, _ = server
    assert main(["--server", address, "session", action, SID]) == 0
    assert sessions.requests[0].session_id == SID
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"session_id          {SID}", f"state               {state}"]


def test_capabilities_json(server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]) -> None:
    address, _, _ = server
    assert main(["--server", address, "--json", "capabilities"]) == 0
    caps = json.loads(capsys.readouterr().out)
    assert caps["modes"] == ["REWIND_MODE_BOTH"]
    assert caps["dry_run"] is True


def test_a_malformed_serve_variable_does_not_touch_client_commands(
    server: tuple[str, Sessions, Rewinds], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only `serve` reads these; a bad one must not break the commands that never use it.
    monkeypatch.setenv("AGENT_REWIND_IDLE_TIMEOUT", "abc")
    monkeypatch.setenv("AGENT_REWIND_SHUTDOWN_GRACE", "soon")
    monkeypatch.setenv("AGENT_REWIND_MODEL", "offlin")
    address, _, _ = server
    assert main(["--server", address, "session", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "more: --page-token page2 (or --all)"


def test_unreachable_server_exits_1_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--server", "127.0.0.1:1", "capabilities"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: cannot reach agent-rewind at 127.0.0.1:1 (")
    assert line.endswith("is the server running (`make run` in another terminal)?")
