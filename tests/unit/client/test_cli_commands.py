"""`agent-rewind` client commands end to end against an in-process gRPC server with canned answers."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, empty_pb2, timestamp_pb2
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
from agent_rewind.cli import EXIT_INTERRUPTED, main
from agent_rewind.client import Client

SID = "11111111-2222-3333-4444-555555555555"
RID = "99999999-8888-4777-8666-555555555555"


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

    def ForkSession(self, request: Any, context: Any) -> session_pb2.Session:  # noqa: N802
        self.requests.append(request)
        return session_pb2.Session(session_id="f0rk", cwd="/ws/f0rk", state=session_pb2.SESSION_STATE_IDLE)

    def DeleteSession(self, request: Any, context: Any) -> empty_pb2.Empty:  # noqa: N802
        self.requests.append(request)
        if request.session_id != SID:
            abort(
                context,
                code_pb2.NOT_FOUND,
                f"session {request.session_id!r} not found",
                "SESSION_NOT_FOUND",
                {"session_id": request.session_id},
            )
        return empty_pb2.Empty()


# What the fake WatchRewindEvents sends, in order: a response, or a call that aborts the stream.
WatchStep = rewind_service_pb2.WatchRewindEventsResponse | Callable[[Any], None]


class Rewinds(rewind_service_pb2_grpc.RewindServiceServicer):
    def __init__(self) -> None:
        self.requests: list[Any] = []
        # The fake watch sends these, then ends the stream.
        self.watch_script: list[WatchStep] = []

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
        files = rewind_pb2.FilesRewindResult(can_rewind=True, requested=True)
        if request.include_diff:
            files.source = rewind_pb2.FILES_SOURCE_SNAPSHOT
            files.files_changed.append("a.txt")
            files.diffs.append(
                rewind_pb2.FileDiff(
                    path="a.txt",
                    change=rewind_pb2.FILE_CHANGE_MODIFIED,
                    unified_diff="--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-new\n+old\n",
                )
            )
        if request.scope == rewind_pb2.REWIND_SCOPE_TURN:
            # A revert whose one conflict (a later edit of the lines the turn changed) is skipped.
            files.files_changed.append("src/a.py")
            files.conflicts.append(
                rewind_pb2.FileConflict(path="src/b.py", resolution=rewind_pb2.CONFLICT_RESOLUTION_SKIPPED)
            )
        return rewind_pb2.RewindResult(files=files, last_message_id="last-1")

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

    def UndoRewind(self, request: Any, context: Any) -> rewind_pb2.RewindResult:  # noqa: N802
        self.requests.append(("UndoRewind", request))
        return rewind_pb2.RewindResult(
            rewind_id=request.rewind_id,
            files=rewind_pb2.FilesRewindResult(requested=True, can_rewind=True, files_changed=["/ws/a.txt"]),
            conversation=rewind_pb2.ConversationRewindResult(
                requested=True, can_rewind=True, rewound=not request.validate_only
            ),
            last_message_id="last-0",
        )

    def WatchRewindEvents(  # noqa: N802
        self, request: Any, context: Any
    ) -> Iterator[rewind_service_pb2.WatchRewindEventsResponse]:
        self.requests.append(("WatchRewindEvents", request))
        for step in self.watch_script:
            if isinstance(step, rewind_service_pb2.WatchRewindEventsResponse):
                yield step
            else:
                step(context)


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


@pytest.mark.parametrize(
    ("flag", "wanted"), [("--workspace-snapshots", True), ("--no-workspace-snapshots", False)]
)
def test_session_create_asks_for_workspace_snapshots_or_none(
    server: tuple[str, Sessions, Rewinds], flag: str, wanted: bool
) -> None:
    address, sessions, _ = server
    assert main(["--server", address, "session", "create", flag]) == 0
    (request,) = sessions.requests
    assert request.HasField("workspace_snapshots") and request.workspace_snapshots is wanted


def test_session_create_leaves_checkpointing_to_the_server_default(
    server: tuple[str, Sessions, Rewinds],
) -> None:
    address, sessions, _ = server
    assert main(["--server", address, "session", "create"]) == 0
    assert not sessions.requests[0].HasField("enable_file_checkpointing")
    assert not sessions.requests[0].HasField("workspace_snapshots")
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
        "✓ result success · 1 model call · 20ms",
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
        "hint: retry: the next call resumes the session in a new process; the unknown-tools case needs the "
        "operator (move the SDK pin back, or teach `sessions/tools.py` the tool)",
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
        "hint: check the id; `ListSessions`",
    ]


def test_points_table_and_footer(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    assert main(["--server", address, "points", SID, "--page-size", "5"]) == 0
    assert rewinds.requests[0].page_size == 5
    assert capsys.readouterr().out.splitlines() == [
        "#  MESSAGE_ID  RESUME_AT  FILES  SNAPSHOT  COMPACTED  CREATED  TEXT",
        "0  p0          -          yes    no        no         -        hi",
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
    # Without --conflicts, --diff, --path and --scope: the server's default policy (refuse), no
    # diffs, every path, everything since the point.
    assert request.conflict_policy == rewind_pb2.CONFLICT_POLICY_UNSPECIFIED
    assert not request.include_diff
    assert (list(request.paths), request.scope) == ([], rewind_pb2.REWIND_SCOPE_UNSPECIFIED)
    out = capsys.readouterr().out
    assert "rewind_id        - (dry run: nothing was applied)" in out
    assert not out.startswith(("scope", "paths")), "nothing narrowed, nothing said about it"


def test_a_revert_dry_run_sends_the_scope_and_paths_and_says_them_first(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    argv = ["--server", address, "rewind", SID, "p0", "--mode", "files", "--dry-run", "--scope", "turn"]
    assert main([*argv, "--path", "src/", "--path", "docs/a b.md", "--conflicts", "skip"]) == 0
    ((method, request),) = rewinds.requests
    assert method == "DryRun"
    assert (request.scope, list(request.paths)) == (rewind_pb2.REWIND_SCOPE_TURN, ["src/", "docs/a b.md"])
    assert request.conflict_policy == rewind_pb2.CONFLICT_POLICY_SKIP
    assert capsys.readouterr().out.splitlines() == [
        "scope            turn: reverts only what that turn changed; later changes stay",
        "paths            src/, docs/a b.md (every other path keeps its content)",
        "files            can_rewind: yes · 1 file changed (+0 -0) · skipped links: 0",
        "                   src/a.py",
        "                 1 conflict (changed since in the lines the turn changed, or as a whole):",
        "                   src/b.py: skipped (left as it is)",
        "conversation     not requested",
        "rewind_id        - (dry run: nothing was applied)",
        "last_message_id  last-1",
    ]


@pytest.mark.parametrize(
    ("flag", "scope"), [("since", rewind_pb2.REWIND_SCOPE_SINCE), ("TURN", rewind_pb2.REWIND_SCOPE_TURN)]
)
def test_scope_and_path_reach_an_applied_rewind_too(
    flag: str, scope: int, server: tuple[str, Sessions, Rewinds]
) -> None:
    address, _, rewinds = server
    argv = ["--server", address, "rewind", SID, "p0", "--mode", "files", "--scope", flag, "--path", "a.txt"]
    assert main(argv) == 1  # the fake Rewind answers REWIND_CONFLICT
    ((method, request),) = rewinds.requests
    assert (method, request.scope, list(request.paths)) == ("Rewind", scope, ["a.txt"])


@pytest.mark.parametrize("mode", ["both", "conversation"])
def test_scope_turn_without_files_mode_is_a_usage_error_and_calls_nothing(
    mode: str, server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    with pytest.raises(SystemExit) as exit_info:
        main(["--server", address, "rewind", SID, "p0", "--mode", mode, "--scope", "turn", "--dry-run"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "agent-rewind rewind: error: --scope turn needs --mode files: a revert of one turn changes "
        "files, never the conversation"
    )
    assert rewinds.requests == []


def test_scope_since_goes_with_every_mode(server: tuple[str, Sessions, Rewinds]) -> None:
    address, _, rewinds = server
    argv = ["--server", address, "rewind", SID, "p0", "--mode", "both", "--scope", "since", "--dry-run"]
    assert main(argv) == 0
    assert rewinds.requests[-1][1].scope == rewind_pb2.REWIND_SCOPE_SINCE


def test_an_unknown_scope_is_a_usage_error(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    with pytest.raises(SystemExit) as exit_info:
        main(["--server", address, "rewind", SID, "p0", "--mode", "files", "--scope", "all"])
    assert exit_info.value.code == 2
    assert "argument --scope: scope must be one of since, turn, got 'all'" in capsys.readouterr().err
    assert rewinds.requests == []


@pytest.mark.parametrize(
    ("flag", "policy"),
    [
        ("refuse", rewind_pb2.CONFLICT_POLICY_REFUSE),
        ("skip", rewind_pb2.CONFLICT_POLICY_SKIP),
        ("overwrite", rewind_pb2.CONFLICT_POLICY_OVERWRITE),
        ("Overwrite", rewind_pb2.CONFLICT_POLICY_OVERWRITE),
    ],
)
def test_conflicts_sets_the_conflict_policy(
    flag: str, policy: int, server: tuple[str, Sessions, Rewinds]
) -> None:
    address, _, rewinds = server
    assert (
        main(["--server", address, "rewind", SID, "p0", "--mode", "files", "--dry-run", "--conflicts", flag])
        == 0
    )
    ((method, request),) = rewinds.requests
    assert method == "DryRun"
    assert request.conflict_policy == policy


def test_conflicts_reaches_an_applied_rewind_too(server: tuple[str, Sessions, Rewinds]) -> None:
    address, _, rewinds = server
    assert main(["--server", address, "rewind", SID, "p0", "--mode", "both", "--conflicts", "skip"]) == 1
    ((method, request),) = rewinds.requests
    assert (method, request.conflict_policy, request.include_diff) == (
        "Rewind",
        rewind_pb2.CONFLICT_POLICY_SKIP,
        False,
    )


def test_an_unknown_conflict_policy_is_a_usage_error(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    with pytest.raises(SystemExit) as exit_info:
        main(["--server", address, "rewind", SID, "p0", "--mode", "files", "--conflicts", "merge"])
    assert exit_info.value.code == 2
    assert (
        "argument --conflicts: not a conflict policy: 'merge' (choose from refuse, skip, overwrite)"
        in capsys.readouterr().err
    )
    assert rewinds.requests == []


def test_diff_with_dry_run_asks_for_diffs_and_prints_them(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    assert main(["--server", address, "rewind", SID, "p0", "--mode", "files", "--dry-run", "--diff"]) == 0
    ((method, request),) = rewinds.requests
    assert (method, request.include_diff) == ("DryRun", True)
    assert capsys.readouterr().out.splitlines() == [
        "files            can_rewind: yes · 1 file changed (+0 -0) · skipped links: 0"
        " · from the workspace snapshot",
        "                   a.txt",
        "conversation     not requested",
        "rewind_id        - (dry run: nothing was applied)",
        "last_message_id  last-1",
        "diffs            modified a.txt",
        "                   --- a/a.txt",
        "                   +++ b/a.txt",
        "                   @@ -1 +1 @@",
        "                   -new",
        "                   +old",
    ]


def test_diff_json_prints_the_diffs_and_the_source(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, _ = server
    assert (
        main(["--server", address, "--json", "rewind", SID, "p0", "--mode", "files", "--dry-run", "--diff"])
        == 0
    )
    files = json.loads(capsys.readouterr().out)["files"]
    assert files["source"] == "FILES_SOURCE_SNAPSHOT"
    assert [(d["path"], d["change"]) for d in files["diffs"]] == [("a.txt", "FILE_CHANGE_MODIFIED")]
    assert files["conflicts"] == [] and files["diffs_truncated"] is False


def test_diff_without_dry_run_is_a_usage_error_and_calls_nothing(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    with pytest.raises(SystemExit) as exit_info:
        main(["--server", address, "rewind", SID, "p0", "--mode", "files", "--diff"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "agent-rewind rewind: error: --diff needs --dry-run: only a preview shows what a rewind would change"
    )
    assert rewinds.requests == []


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
        "hint: re-read, decide again, retry",
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


def test_session_delete_sends_the_flags_and_says_what_it_deleted(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, sessions, _ = server
    request_id = "9a4f0c3e-1111-4222-8333-444455556666"
    assert (
        main(["--server", address, "session", "delete", SID, "--workspace", "--request-id", request_id]) == 0
    )
    assert capsys.readouterr().out == f"deleted {SID} and its workspace\n"
    assert main(["--server", address, "--json", "session", "delete", SID]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "session_id": SID,
        "deleted": True,
        "workspace_deleted": False,
    }
    first, second = sessions.requests
    assert (first.session_id, first.delete_workspace, first.request_id) == (SID, True, request_id)
    assert (second.delete_workspace, len(second.request_id)) == (False, 36), "a fresh request id"
    assert main(["--server", address, "session", "delete", "someone-else"]) == 1
    assert "NOT_FOUND SESSION_NOT_FOUND" in capsys.readouterr().err


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


# --- watch ----------------------------------------------------------------------------------------

TS = timestamp_pb2.Timestamp(seconds=1764457865)  # 2025-11-29T23:11:05Z


def event(cursor: int, **fields: Any) -> rewind_service_pb2.WatchRewindEventsResponse:
    values: dict[str, Any] = {
        "cursor": cursor,
        "kind": rewind_pb2.REWIND_EVENT_KIND_REWOUND,
        "session_id": SID,
        "rewind_id": f"r-{cursor}",
        "message_id": f"m-{cursor}",
        "mode": rewind_pb2.REWIND_MODE_BOTH,
        "files": rewind_pb2.FilesRewindResult(
            can_rewind=True, requested=True, files_changed=["/w/a.txt"], insertions=1, deletions=2
        ),
        "messages_dropped": 4,
        "principal": "alice",
        "occur_time": TS,
        "conversation_changed": True,
    }
    values.update(fields)
    return rewind_service_pb2.WatchRewindEventsResponse(event=rewind_pb2.RewindEvent(**values))


def caught_up(cursor: int) -> rewind_service_pb2.WatchRewindEventsResponse:
    return rewind_service_pb2.WatchRewindEventsResponse(caught_up=rewind_pb2.CaughtUp(cursor=cursor))


def fails(code: int, message: str, reason: str, metadata: dict[str, str]) -> Callable[[Any], None]:
    return lambda context: abort(context, code, message, reason, metadata)


def event_line(cursor: int) -> str:
    return (
        f"cursor {cursor} · 2025-11-29T23:11:05Z · REWOUND · session {SID} · rewind r-{cursor} · mode both"
        f" · message m-{cursor} · 1 file changed (+1 -2) · messages dropped: 4 · by alice"
    )


def watch_request(rewinds: Rewinds) -> Any:
    ((method, request),) = rewinds.requests
    assert method == "WatchRewindEvents"
    return request


def test_watch_after_0_prints_the_replay_the_caught_up_line_and_live_events(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    rewinds.watch_script = [event(1), event(2), caught_up(2), event(3)]
    assert main(["--server", address, "watch", "--after", "0"]) == 0
    request = watch_request(rewinds)
    assert request.session_id == ""
    assert request.HasField("after_cursor") and request.after_cursor == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        event_line(1),
        event_line(2),
        "caught up at cursor 2; following live events",
        event_line(3),
    ]
    # The server ended the stream without an error: say where to resume.
    assert captured.err.splitlines() == ["the server ended the watch; resume with --after 3"]


def test_watch_without_after_asks_for_new_events_only_of_the_session_given(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    rewinds.watch_script = [caught_up(7)]
    assert main(["--server", address, "watch", SID]) == 0
    request = watch_request(rewinds)
    assert request.session_id == SID and not request.HasField("after_cursor")
    assert capsys.readouterr().out == "caught up at cursor 7; following live events\n"


def test_watch_after_n_sends_the_cursor(server: tuple[str, Sessions, Rewinds]) -> None:
    address, _, rewinds = server
    rewinds.watch_script = [caught_up(12)]
    assert main(["--server", address, "watch", "--after", "12", SID]) == 0
    assert watch_request(rewinds).after_cursor == 12


def test_watch_json_prints_one_api_message_per_line(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    deleted = event(
        2,
        kind=rewind_pb2.REWIND_EVENT_KIND_SESSION_DELETED,
        rewind_id="",
        message_id="",
        mode=rewind_pb2.REWIND_MODE_UNSPECIFIED,
        files=None,
        messages_dropped=0,
        conversation_changed=False,
    )
    rewinds.watch_script = [event(1), caught_up(1), deleted]
    assert main(["--server", address, "--json", "watch", "--after", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    first, mark, last = (json.loads(line) for line in lines)
    # Proto field names, every field shown, uint64 as a string: as `to_json` prints messages.
    assert first["event"]["cursor"] == "1"
    assert first["event"]["rewind_id"] == "r-1"
    assert first["event"]["kind"] == "REWIND_EVENT_KIND_REWOUND"
    assert first["event"]["files"]["files_changed"] == ["/w/a.txt"]
    assert first["event"]["occur_time"] == "2025-11-29T23:11:05Z"
    assert mark == {"caught_up": {"cursor": "1"}}
    assert last["event"]["kind"] == "REWIND_EVENT_KIND_SESSION_DELETED"
    assert last["event"]["rewind_id"] == "" and last["event"]["messages_dropped"] == 0


def test_watch_cursor_expired_exits_1_saying_how_to_resync(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    rewinds.watch_script = [
        fails(
            code_pb2.OUT_OF_RANGE,
            "after_cursor 1 is older than the oldest retained event (5)",
            "CURSOR_EXPIRED",
            {"oldest_cursor": "5"},
        )
    ]
    assert main(["--server", address, "watch", "--after", "1"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "error: OUT_OF_RANGE CURSOR_EXPIRED: after_cursor 1 is older than the oldest retained event (5)",
        "  oldest_cursor: 5",
        "hint: the events before cursor 5 are no longer kept and changes may have been missed: resync"
        " what you mirror (`agent-rewind points SESSION`), then watch again with --after 4 (or --after 0:"
        " from the oldest event kept)",
    ]


def test_watch_too_slow_keeps_what_was_printed_and_says_where_to_resume(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    rewinds.watch_script = [
        caught_up(0),
        event(1),
        event(2),
        fails(
            code_pb2.RESOURCE_EXHAUSTED,
            "the watcher fell too far behind; watch again with after_cursor=2",
            "SUBSCRIBER_TOO_SLOW",
            {"last_cursor": "2"},
        ),
    ]
    assert main(["--server", address, "watch"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "caught up at cursor 0; following live events",
        event_line(1),
        event_line(2),
    ]
    assert captured.err.splitlines() == [
        "error: RESOURCE_EXHAUSTED SUBSCRIBER_TOO_SLOW: the watcher fell too far behind; watch again "
        "with after_cursor=2",
        "  last_cursor: 2",
        "hint: resume with --after 2 (the last cursor sent): the events after it are replayed",
    ]


def test_watch_ended_by_a_stopping_server_says_the_last_cursor_printed(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    rewinds.watch_script = [
        event(4),
        caught_up(9),
        fails(code_pb2.UNAVAILABLE, "the server is shutting down", "SHUTTING_DOWN", {}),
    ]
    assert main(["--server", address, "watch", "--after", "3"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [event_line(4), "caught up at cursor 9; following live events"]
    # Events of other sessions (or none) may lie between the last event and caught_up's cursor.
    assert captured.err.splitlines() == [
        "error: UNAVAILABLE SHUTTING_DOWN: the server is shutting down",
        "hint: resume with --after 9 (the last cursor printed)",
    ]


def test_watch_of_an_unknown_session_exits_1_without_a_resume_hint(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    rewinds.watch_script = [
        fails(code_pb2.NOT_FOUND, "session 'nope' not found", "SESSION_NOT_FOUND", {"session_id": "nope"})
    ]
    assert main(["--server", address, "watch", "nope", "--after", "0"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: NOT_FOUND SESSION_NOT_FOUND: session 'nope' not found",
        "  session_id: nope",
        "hint: check the id; `ListSessions`",
    ]


@pytest.mark.parametrize("cursor", ["-1", "x", "1.5"])
def test_watch_refuses_a_cursor_that_is_not_a_whole_number_of_0_or_more(
    cursor: str, server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    with pytest.raises(SystemExit) as exit_info:
        main(["--server", address, "watch", f"--after={cursor}"])
    assert exit_info.value.code == 2
    assert "argument --after:" in capsys.readouterr().err
    assert rewinds.requests == []


class ScriptedWatch:
    """A WatchStream that yields its responses, then raises KeyboardInterrupt (a Ctrl-C while the
    command waits for the next event). Each response is pulled only once what came before is flushed."""

    def __init__(self, out: FlushRecorder, *responses: rewind_service_pb2.WatchRewindEventsResponse) -> None:
        self.out = out
        self.responses = responses
        self.cancelled = False

    def __iter__(self) -> Iterator[rewind_service_pb2.WatchRewindEventsResponse]:
        for response in self.responses:
            assert self.out.pending == "", "a line was left in the buffer while waiting for the next event"
            yield response
        assert self.out.pending == ""
        raise KeyboardInterrupt

    def cancel(self) -> None:
        self.cancelled = True


class FlushRecorder(io.StringIO):
    """stdout that tells what was written but not yet flushed."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        return super().write(text)

    def flush(self) -> None:
        self.pending = ""
        super().flush()


def test_watch_flushes_every_line_and_ctrl_c_exits_130_saying_where_to_resume(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = FlushRecorder()
    stream = ScriptedWatch(out, event(1), caught_up(1), event(2))
    calls: list[tuple[str, int | None]] = []

    def watch_events(self: Client, session_id: str = "", *, after_cursor: int | None = None) -> ScriptedWatch:
        calls.append((session_id, after_cursor))
        return stream

    monkeypatch.setattr(Client, "watch_events", watch_events)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["--server", "127.0.0.1:1", "watch", SID, "--after", "0"]) == EXIT_INTERRUPTED
    assert calls == [(SID, 0)]
    assert stream.cancelled
    assert out.getvalue().splitlines() == [
        event_line(1),
        "caught up at cursor 1; following live events",
        event_line(2),
    ]
    assert capsys.readouterr().err.splitlines() == ["stopped watching; resume with --after 2"]


def test_prompt_rewind_to_sends_the_rewind_with_the_prompt(server: tuple[str, Sessions, Rewinds]) -> None:
    address, sessions, _ = server
    argv = ["--server", address, "prompt", SID, "again", "--rewind-to", "p0", "--mode", "both"]
    assert main([*argv, "--conflicts", "overwrite", "--expect-last", "last-1"]) == 0
    (request,) = sessions.requests
    assert request.HasField("rewind") and request.text == "again"
    assert (request.rewind.message_id, request.rewind.mode, request.rewind.conflict_policy) == (
        "p0",
        rewind_pb2.REWIND_MODE_BOTH,
        rewind_pb2.CONFLICT_POLICY_OVERWRITE,
    )
    assert request.rewind.expected_last_message_id == "last-1"


def test_prompt_without_rewind_to_sends_no_rewind_and_mode_alone_is_a_usage_error(
    server: tuple[str, Sessions, Rewinds],
) -> None:
    address, sessions, _ = server
    assert main(["--server", address, "prompt", SID, "plain"]) == 0
    assert not sessions.requests[0].HasField("rewind")
    with pytest.raises(SystemExit) as exit_info:
        main(["--server", address, "prompt", SID, "plain", "--mode", "both"])
    assert exit_info.value.code == 2
    assert len(sessions.requests) == 1, "nothing sent"


def test_undo_sends_the_rewind_and_prints_what_it_put_back(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, rewinds = server
    assert main(["--server", address, "undo", SID, "r-1", "--conflicts", "skip", "--request-id", RID]) == 0
    ((method, request),) = rewinds.requests
    assert (method, request.rewind_id, request.validate_only) == ("UndoRewind", "r-1", False)
    assert (request.conflict_policy, request.request_id) == (rewind_pb2.CONFLICT_POLICY_SKIP, RID)
    out = capsys.readouterr().out
    assert "undid            r-1" in out and "/ws/a.txt" in out and "rewound: yes" in out
    assert main(["--server", address, "undo", SID, "r-1", "--dry-run"]) == 0
    assert rewinds.requests[-1][1].validate_only
    assert "rewound: no" in capsys.readouterr().out


def test_undo_and_rewind_dry_runs_say_alike_that_nothing_was_applied(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _, _ = server
    assert main(["--server", address, "undo", SID, "r-1", "--dry-run"]) == 0
    undo = capsys.readouterr().out.splitlines()
    assert main(["--server", address, "rewind", SID, "p0", "--mode", "files", "--dry-run"]) == 0
    rewind = capsys.readouterr().out.splitlines()
    assert "would undo       r-1 (dry run: nothing was applied)" in undo
    assert not any(line.startswith(("rewind_id", "undid")) for line in undo), "no id of an applied change"
    assert "rewind_id        - (dry run: nothing was applied)" in rewind


def test_session_fork_sends_the_point_and_prints_the_new_session(
    server: tuple[str, Sessions, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, sessions, _ = server
    assert main(["--server", address, "session", "fork", SID, "p0", "--cwd", "forked"]) == 0
    (request,) = sessions.requests
    assert (request.session_id, request.message_id, request.cwd) == (SID, "p0", "forked")
    assert request.request_id, "a fresh request id, so a retry is safe"
    assert "f0rk" in capsys.readouterr().out
    assert main(["--server", address, "session", "fork", SID]) == 0
    assert sessions.requests[-1].message_id == "", "no point: the whole session"
