"""`prompt --full` and `undo` without a rewind id, end to end against an in-process gRPC server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, struct_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from agent_rewind.api.v1 import (
    rewind_pb2,
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.cli import main
from agent_rewind.client import TOOL_OUTPUT_LINES

SID = "11111111-2222-3333-4444-555555555555"
OUTPUT = [f"line {i}" for i in range(TOOL_OUTPUT_LINES + 10)]


def event(
    kind: rewind_pb2.RewindEventKind.ValueType, rewind_id: str
) -> rewind_service_pb2.WatchRewindEventsResponse:
    return rewind_service_pb2.WatchRewindEventsResponse(
        event=rewind_pb2.RewindEvent(kind=kind, rewind_id=rewind_id, session_id=SID)
    )


class Sessions(session_service_pb2_grpc.SessionServiceServicer):
    def Prompt(self, request: Any, context: Any) -> Iterator[session_pb2.TurnEvent]:  # noqa: N802
        command = struct_pb2.Struct()
        command.update({"command": "seq"})
        use = session_pb2.ToolUse(id="toolu_1", name="Bash", input=command)
        yield session_pb2.TurnEvent(assistant_message=session_pb2.AssistantMessage(tool_uses=[use]))
        yield session_pb2.TurnEvent(
            tool_result=session_pb2.ToolResult(tool_use_id="toolu_1", content="\n".join(OUTPUT))
        )
        yield session_pb2.TurnEvent(result=session_pb2.TurnResult(subtype="success", num_turns=1))


class Rewinds(rewind_service_pb2_grpc.RewindServiceServicer):
    def __init__(self) -> None:
        self.undone: list[Any] = []
        self.watches: list[Any] = []
        # The replay the fake watch sends before caught_up; after it, it stays open as a live watch does.
        self.replay: list[rewind_service_pb2.WatchRewindEventsResponse] = []
        self.watch_denied = False
        self.released = threading.Event()

    def WatchRewindEvents(  # noqa: N802
        self, request: Any, context: Any
    ) -> Iterator[rewind_service_pb2.WatchRewindEventsResponse]:
        self.watches.append(request)
        if self.watch_denied:
            detail = any_pb2.Any()
            detail.Pack(
                error_details_pb2.ErrorInfo(
                    reason="PERMISSION_DENIED",
                    domain="agent-rewind.v1",
                    metadata={"permission": "events.read"},
                )
            )
            context.abort_with_status(
                rpc_status.to_status(
                    status_pb2.Status(
                        code=code_pb2.PERMISSION_DENIED, message="needs events.read", details=[detail]
                    )
                )
            )
        yield from self.replay
        yield rewind_service_pb2.WatchRewindEventsResponse(caught_up=rewind_pb2.CaughtUp(cursor=9))
        self.released.wait(5)  # live: nothing more until the client goes away

    def UndoRewind(self, request: Any, context: Any) -> rewind_pb2.RewindResult:  # noqa: N802
        self.undone.append(request)
        return rewind_pb2.RewindResult(rewind_id=request.rewind_id, last_message_id="last-0")


@pytest.fixture
def server() -> Iterator[tuple[str, Rewinds]]:
    rewinds = Rewinds()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    session_service_pb2_grpc.add_SessionServiceServicer_to_server(Sessions(), grpc_server)
    rewind_service_pb2_grpc.add_RewindServiceServicer_to_server(rewinds, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        yield f"127.0.0.1:{port}", rewinds
    finally:
        rewinds.released.set()
        grpc_server.stop(None)


def test_prompt_shows_a_bash_output_up_to_the_cap_and_full_shows_it_all(
    server: tuple[str, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _ = server
    assert main(["--server", address, "prompt", SID, "bash seq"]) == 0
    cut = capsys.readouterr().out.splitlines()
    assert [f"  {line}" for line in OUTPUT[:TOOL_OUTPUT_LINES]] == cut[2 : 2 + TOOL_OUTPUT_LINES]
    assert cut[2 + TOOL_OUTPUT_LINES].startswith("  … 10 more lines (")
    assert main(["--server", address, "prompt", SID, "bash seq", "--full"]) == 0
    whole = capsys.readouterr().out.splitlines()
    assert whole[1:-1] == ["↳ tool result", *(f"  {line}" for line in OUTPUT)]


def test_undo_without_a_rewind_id_undoes_the_latest_rewind_in_the_sessions_events(
    server: tuple[str, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, rewinds = server
    rewinds.replay = [
        event(rewind_pb2.REWIND_EVENT_KIND_REWOUND, "r-1"),
        event(rewind_pb2.REWIND_EVENT_KIND_UNDONE, "r-1"),
        event(rewind_pb2.REWIND_EVENT_KIND_REWOUND, "r-2"),
    ]
    assert main(["--server", address, "undo", SID, "--dry-run"]) == 0
    (watch,) = rewinds.watches
    assert (watch.session_id, watch.HasField("after_cursor"), watch.after_cursor) == (SID, True, 0)
    (undo,) = rewinds.undone
    assert (undo.rewind_id, undo.validate_only) == ("r-2", True)
    assert "would undo       r-2 (dry run: nothing was applied)" in capsys.readouterr().out


def test_undo_without_a_rewind_id_of_a_session_with_none_says_so_and_undoes_nothing(
    server: tuple[str, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, rewinds = server
    assert main(["--server", address, "undo", SID]) == 1
    assert rewinds.undone == []
    assert f"session {SID} has no rewind to undo" in capsys.readouterr().err


def test_undo_without_a_rewind_id_where_events_cannot_be_read_says_to_pass_one(
    server: tuple[str, Rewinds], capsys: pytest.CaptureFixture[str]
) -> None:
    address, rewinds = server
    rewinds.watch_denied = True
    assert main(["--server", address, "undo", SID]) == 1
    assert rewinds.undone == []
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: PERMISSION_DENIED")
    assert err[-1].startswith("hint: undo without REWIND_ID reads the session's events")
    assert main(["--server", address, "undo", SID, "r-9"]) == 0, "with an id, no events are read"
    assert [u.rewind_id for u in rewinds.undone] == ["r-9"]
