"""History editing end to end: a prompt that rewinds first (PromptRequest.rewind), against the
real server and real Claude Code processes."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_pb2, session_service_pb2
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import BOTH, FILES, Client, client_of, error_info, prompt_id, read, serve

P0 = "write a.txt v0\nsay made a"
P1 = "edit a.txt v0 => v1\nwrite b.txt bee\nsay edited a, made b"
P2 = "edit a.txt v1 => v2\nwrite c.txt sea\nsay edited a, made c"


async def _three_turns(c: Client) -> tuple[str, Path, list[str]]:
    session = await c.create()
    ids = [prompt_id(await c.prompt(session.session_id, p)) for p in (P0, P1, P2)]
    return session.session_id, Path(session.cwd), ids


def _edit(sid: str, text: str, **rewind: Any) -> session_service_pb2.PromptRequest:
    return session_service_pb2.PromptRequest(
        session_id=sid, text=text, rewind=session_service_pb2.PromptRewind(**rewind)
    )


@pytest.mark.parametrize("snapshots", [False, True])
async def test_an_edited_prompt_rewinds_then_runs_and_says_which_rewind_it_applied(
    tmp_path: Path, snapshots: bool
) -> None:
    async with serve(tmp_path, workspace_snapshots=snapshots) as c:
        sid, cwd, ids = await _three_turns(c)
        events = [
            e async for e in c.sessions.Prompt(_edit(sid, "write d.txt dee", message_id=ids[1], mode=BOTH))
        ]
        first = events[0]
        assert first.WhichOneof("event") == "rewind", "the stream opens with the rewind it applied"
        assert first.rewind.rewind_id and first.rewind.conversation.rewound and first.rewind.files.can_rewind
        expected = rewind_pb2.FILES_SOURCE_SNAPSHOT if snapshots else rewind_pb2.FILES_SOURCE_CHECKPOINT
        assert first.rewind.files.source == expected
        assert events[-1].WhichOneof("event") == "result"
        # The files as they were before P1, then the new prompt's own edit.
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v0\n", None, None)
        assert read(cwd / "d.txt") == "dee\n"
        assert await c.recall(sid) == [P0, "write d.txt dee", "recall"]
        points = [p.message_id for p in (await c.points(sid)).points]
        assert points[:2] == [ids[0], prompt_id(events)]


async def test_a_refused_rewind_runs_nothing_and_ends_the_stream_with_its_status(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        stale = str(ids[0])
        call = c.sessions.Prompt(
            _edit(sid, "write z.txt zed", message_id=ids[1], mode=BOTH, expected_last_message_id=stale)
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [e async for e in call]
        assert err.value.code() == grpc.StatusCode.ABORTED
        assert error_info(err.value).reason == "REWIND_CONFLICT"
        assert read(cwd / "z.txt") is None and read(cwd / "c.txt") == "sea\n", "nothing ran, nothing restored"
        assert [p.message_id for p in (await c.points(sid)).points] == ids
        # A rewind to a point that does not exist: the same, NOT_FOUND.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [e async for e in c.sessions.Prompt(_edit(sid, "say hi", message_id="msg_nope", mode=BOTH))]
        assert error_info(err.value).reason == "MESSAGE_NOT_FOUND"
        assert (await c.get(sid)).state == session_pb2.SESSION_STATE_IDLE


async def test_an_edited_prompt_leaves_no_window_for_another_prompt(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, _, ids = await _three_turns(c)
        call = c.sessions.Prompt(_edit(sid, "sleep 1\nsay edited", message_id=ids[1], mode=BOTH))
        stream = call.__aiter__()
        opening = await stream.__anext__()
        assert opening.WhichOneof("event") == "rewind"
        # The rewind is applied and the prompt not yet answered: another prompt is refused, and
        # never runs between the two.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.prompt(sid, "say slipped in")
        assert error_info(err.value).reason == "TURN_IN_FLIGHT"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, ids[0], BOTH)
        assert error_info(err.value).reason == "TURN_IN_FLIGHT"
        _ = [e async for e in stream]
        assert await c.recall(sid) == [P0, "sleep 1\nsay edited", "recall"]


# UndoRewind


def _undo(sid: str, rewind_id: str, **kw: Any) -> rewind_service_pb2.UndoRewindRequest:
    return rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewind_id, **kw)


@pytest.mark.parametrize("snapshots", [False, True])
async def test_an_undo_brings_back_the_files_and_the_conversation(tmp_path: Path, snapshots: bool) -> None:
    async with serve(tmp_path, workspace_snapshots=snapshots) as c:
        sid, cwd, ids = await _three_turns(c)
        rewound = await c.rewind(sid, ids[1], BOTH)
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v0\n", None, None)

        preview = await c.rewinds.UndoRewind(_undo(sid, rewound.rewind_id, validate_only=True))
        assert preview.rewind_id == rewound.rewind_id and preview.conversation.can_rewind
        assert sorted(Path(f).name for f in preview.files.files_changed) == ["a.txt", "b.txt", "c.txt"]
        assert read(cwd / "a.txt") == "v0\n", "a preview applies nothing"

        undone = await c.rewinds.UndoRewind(_undo(sid, rewound.rewind_id))
        assert undone.rewind_id == rewound.rewind_id and undone.conversation.rewound
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v2\n", "bee\n", "sea\n")
        assert [p.message_id for p in (await c.points(sid)).points] == ids
        assert await c.recall(sid) == [P0, P1, P2, "recall"], "the model sees the dropped prompts again"
        events = await c.events(sid)
        assert [(e.kind, e.rewind_id) for e in events] == [
            (rewind_pb2.REWIND_EVENT_KIND_REWOUND, rewound.rewind_id),
            (rewind_pb2.REWIND_EVENT_KIND_UNDONE, rewound.rewind_id),
        ]
        # What the undo put back is the service's doing, not an outside edit: rewinding again
        # finds no conflict.
        again = await c.rewind(sid, ids[1], FILES)
        assert not again.files.conflicts and read(cwd / "c.txt") is None


async def test_an_undo_is_refused_after_a_turn_for_an_older_rewind_and_for_an_undo(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        first = await c.rewind(sid, ids[2], BOTH)
        await c.prompt(sid, "write d.txt dee")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewinds.UndoRewind(_undo(sid, first.rewind_id))
        assert (err.value.code(), error_info(err.value).reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "UNDO_UNAVAILABLE",
        )
        points = [p.message_id for p in (await c.points(sid)).points]
        second = await c.rewind(sid, points[-1], BOTH)
        third = await c.rewind(sid, ids[1], FILES)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewinds.UndoRewind(_undo(sid, second.rewind_id))
        assert error_info(err.value).reason == "UNDO_UNAVAILABLE", "not the latest"
        rid = str(uuid.uuid4())
        undone = await c.rewinds.UndoRewind(_undo(sid, third.rewind_id, request_id=rid))
        assert await c.rewinds.UndoRewind(_undo(sid, third.rewind_id, request_id=rid)) == undone, "idempotent"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewinds.UndoRewind(_undo(sid, third.rewind_id))
        assert error_info(err.value).reason == "UNDO_UNAVAILABLE", "an undo cannot be undone"
        assert "undone already" in err.value.details()
        # A new rewind may follow an undo.
        again = await c.rewind(sid, ids[1], FILES)
        assert again.files.can_rewind and read(cwd / "b.txt") is None


async def test_files_changed_since_the_rewind_are_refused_skipped_or_overwritten(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        rewound = await c.rewind(sid, ids[1], FILES)
        (cwd / "a.txt").write_text("a person's\n")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewinds.UndoRewind(_undo(sid, rewound.rewind_id))
        assert error_info(err.value).reason == "EXTERNAL_CHANGES"
        assert read(cwd / "a.txt") == "a person's\n" and read(cwd / "b.txt") is None, "nothing applied"
        skipped = await c.rewinds.UndoRewind(
            _undo(sid, rewound.rewind_id, conflict_policy=rewind_pb2.CONFLICT_POLICY_SKIP)
        )
        assert [(x.path, x.resolution) for x in skipped.files.conflicts] == [
            ("a.txt", rewind_pb2.CONFLICT_RESOLUTION_SKIPPED)
        ]
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == (
            "a person's\n",
            "bee\n",
            "sea\n",
        )


async def test_an_undo_works_across_a_restart_of_the_server(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "state")
    try:
        await server.start()
        c = client_of(server)
        sid, cwd, ids = await _three_turns(c)
        rewound = await c.rewind(sid, ids[1], BOTH)
        server.kill(with_cli=True)
        await server.wait()
        await server.start()
        c = client_of(server)
        await c.rewinds.UndoRewind(_undo(sid, rewound.rewind_id))
        assert (read(cwd / "a.txt"), read(cwd / "c.txt")) == ("v2\n", "sea\n")
        assert await c.recall(sid) == [P0, P1, P2, "recall"]
    finally:
        await server.close()


async def test_a_crash_mid_undo_is_finished_by_the_restart(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "state")
    try:
        await server.start(fault="undo.files_restored")
        c = client_of(server)
        sid, cwd, ids = await _three_turns(c)
        rewound = await c.rewind(sid, ids[1], BOTH)
        with pytest.raises(grpc.aio.AioRpcError):
            await c.rewinds.UndoRewind(_undo(sid, rewound.rewind_id))
        assert await server.wait() == -9
        await server.start()
        c = client_of(server)
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v2\n", "bee\n", "sea\n")
        assert [p.message_id for p in (await c.points(sid)).points] == ids
        kinds = [e.kind for e in await c.events(sid)]
        assert kinds == [rewind_pb2.REWIND_EVENT_KIND_REWOUND, rewind_pb2.REWIND_EVENT_KIND_UNDONE]
    finally:
        await server.close()


# ForkSession


def fork_transcript(state: Path, session_id: str) -> str:
    (path,) = (state / "claude" / "projects").glob(f"*/{session_id}.jsonl")
    return path.read_text()


def _fork(sid: str, message_id: str = "", **kw: Any) -> session_service_pb2.ForkSessionRequest:
    return session_service_pb2.ForkSessionRequest(session_id=sid, message_id=message_id, **kw)


async def test_a_fork_at_a_point_has_the_conversation_and_files_of_that_moment_and_lives_apart(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd, ids = await _three_turns(c)
        fork = await c.sessions.ForkSession(_fork(sid, ids[1]))
        fid, fcwd = fork.session_id, Path(fork.cwd)
        assert fid != sid and fcwd != cwd and fork.workspace_snapshots
        assert (read(fcwd / "a.txt"), read(fcwd / "b.txt"), read(fcwd / "c.txt")) == ("v0\n", None, None)
        assert await c.recall(fid) == [P0, "recall"], "the source's prompts before the point only"
        # The source is untouched, and each lives on its own.
        assert (read(cwd / "a.txt"), read(cwd / "c.txt")) == ("v2\n", "sea\n")
        await c.prompt(fid, "write fork.txt only here")
        await c.prompt(sid, "write source.txt only there")
        assert read(cwd / "fork.txt") is None and read(fcwd / "source.txt") is None
        assert read(fcwd / "fork.txt") == "only here\n", "the fork's agent works in its own workspace"
        assert str(cwd) not in fork_transcript(tmp_path, fid), "its history names its own workspace"
        assert await c.recall(sid) == [P0, P1, P2, "write source.txt only there", "recall"]
        assert await c.recall(fid) == [P0, "recall", "write fork.txt only here", "recall"]
        fork_points = [p.message_id for p in (await c.points(fid)).points]
        await c.rewind(fid, fork_points[1], BOTH)
        assert read(fcwd / "fork.txt") is None and read(fcwd / "a.txt") == "v0\n"
        assert [p.message_id for p in (await c.points(sid)).points][:3] == ids, "the source keeps its points"


async def test_a_fork_says_where_it_came_from_also_after_a_restart(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, _, ids = await _three_turns(c)
        events = await c.prompt(sid, "say last")
        last = prompt_id(events)
        reply = next(e.assistant_message.api_message_id for e in events if e.HasField("assistant_message"))
        at_point = await c.sessions.ForkSession(_fork(sid, ids[1]))
        whole = await c.sessions.ForkSession(_fork(sid))
        # A reply's msg_ id names its turn's prompt: the origin is that prompt.
        by_reply = await c.sessions.ForkSession(_fork(sid, reply))
        assert at_point.forked_from == session_pb2.ForkOrigin(session_id=sid, message_id=ids[1])
        assert whole.forked_from == session_pb2.ForkOrigin(session_id=sid, message_id="")
        assert by_reply.forked_from == session_pb2.ForkOrigin(session_id=sid, message_id=last)
        assert not (await c.get(sid)).HasField("forked_from")
    async with serve(tmp_path, workspace_snapshots=True) as c:
        assert (await c.get(at_point.session_id)).forked_from == at_point.forked_from
        assert (await c.get(whole.session_id)).forked_from == whole.forked_from
        listed = {
            s.session_id: s
            for s in (await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest())).sessions
        }
        assert listed[at_point.session_id].forked_from == at_point.forked_from
        assert not listed[sid].HasField("forked_from")


async def test_a_fork_of_the_whole_session_copies_it_as_it_is(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, _, ids = await _three_turns(c)
        rid = str(uuid.uuid4())
        fork = await c.sessions.ForkSession(_fork(sid, request_id=rid))
        again = await c.sessions.ForkSession(_fork(sid, request_id=rid))
        assert again.session_id == fork.session_id, "a retry gets the same fork"
        fcwd = Path(fork.cwd)
        assert (read(fcwd / "a.txt"), read(fcwd / "b.txt"), read(fcwd / "c.txt")) == (
            "v2\n",
            "bee\n",
            "sea\n",
        )
        assert await c.recall(fork.session_id) == [P0, P1, P2, "recall"]
        # Without workspace snapshots, a fork at a point has no files to start from.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.sessions.ForkSession(_fork(sid, ids[1]))
        assert error_info(err.value).reason == "SNAPSHOT_UNAVAILABLE"


async def test_a_caller_hanging_up_mid_fork_leaves_a_whole_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_rewind.sessions import forking

    copying = threading.Event()
    real = forking.copy_workspace

    def slow_copy(*args: Any) -> None:
        copying.set()
        time.sleep(0.5)
        real(*args)

    monkeypatch.setattr(forking, "copy_workspace", slow_copy)
    async with serve(tmp_path) as c:
        sid, _, _ = await _three_turns(c)
        call = asyncio.ensure_future(c.sessions.ForkSession(_fork(sid)))
        assert await asyncio.to_thread(copying.wait, 10)
        call.cancel()  # the caller hangs up while the workspace is being copied
        with pytest.raises(asyncio.CancelledError):
            await call

        async def fork_listed() -> list[session_pb2.Session]:
            while True:
                listed = await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest())
                forks = [s for s in listed.sessions if s.session_id != sid]
                if forks and forks[0].turn_count:
                    return forks
                await asyncio.sleep(0.05)

        (fork,) = await asyncio.wait_for(fork_listed(), 20)
        assert await c.recall(fork.session_id) == [P0, P1, P2, "recall"], "the fork was finished"
