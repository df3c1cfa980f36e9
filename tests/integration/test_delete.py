"""DeleteSession through the real server and the real CLI (API.md, "History editing"): erasure
for good. A unique text goes into every place a session's content reaches (a kept prompt, a
prompt a rewind dropped, a subagent's prompt, a file the agent wrote, an assistant reply, the
session's options, request ids' records, a rewind's event); after the delete no file under the
state dir holds it, the ledger's -wal and -shm included. The session is SESSION_NOT_FOUND, its
SESSION_DELETED event is in the log, other sessions are untouched, and a restart (a crash midway
included) brings nothing back."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_pb2, session_service_pb2
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import (
    BOTH,
    RUNNING,
    Client,
    cli_pids,
    client_of,
    error_info,
    prompt_id,
    read,
    result_of,
    serve,
)

SESSION_DELETED = rewind_pb2.REWIND_EVENT_KIND_SESSION_DELETED


def holding(state_dir: Path, text: str) -> list[Path]:
    """Every file under the state dir whose bytes, or whose path, hold `text`."""
    needle = text.encode()
    found: list[Path] = []
    for path in sorted(state_dir.rglob("*")):
        named = text in str(path.relative_to(state_dir))
        if named or (path.is_file() and not path.is_symlink() and needle in path.read_bytes()):
            found.append(path)
    return found


async def delete(c: Client, session_id: str, *, request_id: str = "", workspace: bool = False) -> None:
    await c.sessions.DeleteSession(
        session_service_pb2.DeleteSessionRequest(
            session_id=session_id, request_id=request_id, delete_workspace=workspace
        )
    )


async def refused(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code(), error_info(err.value).reason


NOT_FOUND = (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


async def all_events(c: Client) -> list[rewind_pb2.RewindEvent]:
    """The whole event log, every session's, replayed from the start up to `caught_up` (a deleted
    session cannot be watched by its id any more)."""
    call = c.rewinds.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest(after_cursor=0))
    out: list[rewind_pb2.RewindEvent] = []
    try:
        async for response in call:
            if response.HasField("caught_up"):
                return out
            out.append(response.event)
    finally:
        call.cancel()
    raise AssertionError("the event stream ended before caught_up")


async def _full_session(c: Client, marker: str) -> tuple[str, Path]:
    """A session whose content holds `marker` everywhere it can: options, a kept prompt and its
    reply and file, a dropped prompt with its reply and a file named after it, a subagent's
    prompt, a prompt after the rewind; every prompt with a request id; snapshots on."""
    options = struct_pb2.Struct()
    options.update({"system_prompt": f"You keep the secret {marker}.", "allowed_tools": ["Agent"]})
    session = await c.create(options=options, workspace_snapshots=True)
    sid, cwd = session.session_id, Path(session.cwd)

    async def prompt(text: str) -> list[session_pb2.TurnEvent]:
        events = await c.prompt_events(sid, text, str(uuid.uuid4()))
        assert not result_of(events).is_error, events
        return events

    await prompt(f"write kept.txt kept {marker}\nsay kept {marker}")
    dropped = await prompt(f"write {marker}.txt dropped {marker}\nsay dropped {marker}")
    await prompt(f"agent write sub.txt written by a subagent told {marker}")
    rewound = await c.rewind(sid, prompt_id(dropped), BOTH, request_id=str(uuid.uuid4()))
    assert rewound.conversation.rewound and rewound.files.can_rewind
    assert any(marker in path for path in rewound.files.files_changed), "the event names the file"
    await prompt(f"say after the rewind {marker}")
    return sid, cwd


async def test_delete_erases_every_copy_of_the_session_and_nothing_else(tmp_path: Path) -> None:
    state = tmp_path / "state"
    marker = uuid.uuid4().hex
    async with serve(state, workspace_snapshots=True) as c:
        other = await c.create()
        other_point = prompt_id(await c.prompt(other.session_id, "write keep.txt another session's file"))
        sid, cwd = await _full_session(c, marker)
        before = holding(state, marker)
        # The text really is in every kind of place the erasure must reach.
        claude = state / "claude"
        assert any(p.suffix == ".jsonl" and p.parent.parent == claude / "projects" for p in before), before
        assert any("subagents" in p.parts for p in before), before
        assert any(p.is_relative_to(cwd) for p in before), before
        assert any(p.name.startswith("ledger.sqlite3") for p in before), before
        assert (state / "snapshots" / f"{sid}.git").is_dir()
        assert (claude / "file-history" / sid).is_dir()

        request_id = str(uuid.uuid4())
        await delete(c, sid, request_id=request_id, workspace=True)

        assert holding(state, marker) == []
        assert not cli_pids(sid), "the CLI process of a deleted session is gone"
        assert not cwd.exists()
        assert not (state / "snapshots" / f"{sid}.git").exists()
        assert not (claude / "file-history" / sid).exists()
        assert not list(claude.glob(f"projects/*/{sid}*"))
        assert not [p for p in state.rglob(f"*{sid}*")], "nothing named after it either"

        # Gone from every read; a retry with the request id is answered as the first call was.
        assert await refused(c.get(sid)) == NOT_FOUND
        assert await refused(c.points(sid)) == NOT_FOUND
        assert await refused(c.prompt(sid, "say hello")) == NOT_FOUND
        listed = await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest())
        assert [s.session_id for s in listed.sessions] == [other.session_id]
        await delete(c, sid, request_id=request_id, workspace=True)
        assert await refused(delete(c, sid)) == NOT_FOUND, "without a request id, a second delete"
        reused = await refused(delete(c, sid, request_id=request_id))
        assert reused == (grpc.StatusCode.INVALID_ARGUMENT, "REQUEST_ID_REUSED")
        # A deleted session's id is never used again.
        again = await refused(c.create(session_id=sid))
        assert again == (grpc.StatusCode.ALREADY_EXISTS, "SESSION_ALREADY_EXISTS")

        events = [e for e in await all_events(c) if e.session_id == sid]
        assert [e.kind for e in events] == [rewind_pb2.REWIND_EVENT_KIND_REWOUND, SESSION_DELETED]
        assert list(events[0].files.files_changed) == [], "the rewind's paths were erased"
        assert events[1].cursor > events[0].cursor and not events[1].rewind_id

        # The other session is untouched and works.
        assert (await c.get(other.session_id)).turn_count == 1
        assert [p.message_id for p in (await c.points(other.session_id)).points] == [other_point]
        assert read(Path(other.cwd) / "keep.txt") == "another session's file\n"
        assert await c.recall(other.session_id) == ["write keep.txt another session's file", "recall"]

    async with serve(state, workspace_snapshots=True) as c:  # a restart brings nothing back
        assert await refused(c.get(sid)) == NOT_FOUND
        listed = await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest())
        assert [s.session_id for s in listed.sessions] == [other.session_id]
        assert [e.kind for e in await all_events(c) if e.session_id == sid][-1] == SESSION_DELETED
        await delete(c, sid, request_id=request_id, workspace=True)  # still answered
    assert holding(state, marker) == []


async def test_delete_keeps_the_workspace_unless_asked_and_a_live_watcher_sees_the_event(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path / "state") as c:
        session = await c.create()
        sid, cwd = session.session_id, Path(session.cwd)
        await c.prompt(sid, "write notes.txt the user's own notes")
        watch = c.rewinds.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest(session_id=sid))
        stream = aiter(watch)
        assert (await anext(stream)).HasField("caught_up")
        await delete(c, sid)
        event = (await asyncio.wait_for(anext(stream), 10)).event
        watch.cancel()
        assert (event.kind, event.session_id) == (SESSION_DELETED, sid)
        assert read(cwd / "notes.txt") == "the user's own notes\n", "the workspace stays"
        assert not list((tmp_path / "state" / "claude").glob(f"projects/*/{sid}.jsonl"))
        # Its workspace is free for a new session.
        fresh = await c.create(cwd=str(cwd))
        assert fresh.cwd == str(cwd)


async def test_delete_ends_a_running_turn_and_its_process_first(tmp_path: Path) -> None:
    async with serve(tmp_path / "state", interrupt_timeout=5) as c:
        session = await c.create()
        sid = session.session_id
        marker = uuid.uuid4().hex
        turn = asyncio.create_task(c.prompt(sid, f"say {marker}\nsleep 60\nsay never"))
        await c.wait_for_state(sid, RUNNING)
        assert cli_pids(sid)
        await asyncio.wait_for(delete(c, sid, workspace=True), 30)
        events = await asyncio.wait_for(turn, 10)
        assert result_of(events).interrupted or result_of(events).is_error
        assert not cli_pids(sid)
        assert holding(tmp_path / "state", marker) == []
        assert await refused(c.get(sid)) == NOT_FOUND


async def test_only_the_owner_or_an_admin_may_delete(tmp_path: Path) -> None:
    from tests.integration.test_auth import TOKENS, _as, _server

    async with _server(tmp_path) as c:
        alice, bob, admin = (_as(c, TOKENS[n]) for n in ("alice", "bob", "admin"))
        mine = (await alice.create()).session_id
        theirs = (await alice.create()).session_id
        assert await refused(delete(bob, mine)) == NOT_FOUND
        await alice.get(mine)
        await delete(alice, mine)
        await delete(admin, theirs)
        for sid in (mine, theirs):
            assert await refused(alice.get(sid)) == NOT_FOUND
        deleted = [e for e in await all_events(alice) if e.kind == SESSION_DELETED]
        assert sorted((e.session_id, e.principal) for e in deleted) == sorted(
            [(mine, "alice"), (theirs, "admin")]
        ), "the owner sees the deletion of their sessions, whoever deleted them"
        assert [e for e in await all_events(bob) if e.kind == SESSION_DELETED] == []


# A crash midway (agent_rewind.faults): after the commit, the next start finishes the erasure
# before it admits a call; a retry with the request id is answered as if nothing had happened.


@pytest.mark.parametrize("step", ["delete.recorded", "delete.erased"])
async def test_a_crash_after_the_commit_is_finished_by_the_next_start(
    server: ServerProcess, step: str
) -> None:
    await server.start(fault=step, fault_scope="group")
    c = client_of(server)
    marker = uuid.uuid4().hex
    other = await c.create()
    await c.prompt(other.session_id, "say the other session")
    sid, cwd = await _full_session(c, marker)
    request_id = str(uuid.uuid4())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await delete(c, sid, request_id=request_id, workspace=True)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, "the caller sees no answer"
    assert await server.wait() == -9
    if step == "delete.recorded":
        assert holding(server.state_dir, marker), "killed before the files were erased"
    await server.start()
    assert holding(server.state_dir, marker) == []
    assert not cwd.exists()
    c = client_of(server)
    assert await refused(c.get(sid)) == NOT_FOUND
    await delete(c, sid, request_id=request_id, workspace=True)
    assert [e.kind for e in await all_events(c) if e.session_id == sid][-1] == SESSION_DELETED
    assert (await c.get(other.session_id)).turn_count == 1


async def test_a_crash_before_the_commit_deletes_nothing(server: ServerProcess) -> None:
    """Killed while the turn it ends is being recorded: the session is all there after the
    restart, and a retry deletes it."""
    await server.start(fault="turn.recorded", fault_scope="group")
    c = client_of(server)
    session = await c.create()
    sid = session.session_id
    turn = asyncio.create_task(c.prompt(sid, "write a.txt one\nsleep 60"))
    await c.wait_for_state(sid, RUNNING)
    request_id = str(uuid.uuid4())
    with pytest.raises(grpc.aio.AioRpcError):
        await delete(c, sid, request_id=request_id)
    with pytest.raises(grpc.aio.AioRpcError):
        await turn
    assert await server.wait() == -9
    await server.start()
    c = client_of(server)
    assert (await c.get(sid)).session_id == sid
    assert [p.text for p in (await c.points(sid)).points] == ["write a.txt one\nsleep 60"]
    await delete(c, sid, request_id=request_id)
    assert await refused(c.get(sid)) == NOT_FOUND
    assert not list((server.state_dir / "claude").glob(f"projects/*/{sid}.jsonl"))
