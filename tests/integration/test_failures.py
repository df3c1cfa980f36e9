"""Failure paths against the real CLI: no session wedged, no rewind half-recorded, no turn lost,
resurrected or wrongly cut (issue 7). Crashes of the server process are in test_crash.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from agent_rewind.api.v1 import session_pb2, session_service_pb2
from agent_rewind.testing.processes import cli_pids
from tests.integration.harness import (
    BOTH,
    FILES,
    RUNNING,
    Client,
    bad_request,
    error_info,
    prompt_id,
    read,
    result_of,
    serve,
)

CLOSED = session_pb2.SESSION_STATE_CLOSED


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


# 1. Slash commands, stuck turns, CloseSession force


async def test_slash_commands_other_than_compact_are_refused_naming_text(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        await c.prompt(sid, "say one")
        for command in ("/cost", "/clear", "/rewind", "/resume", "/mcp", "/CLEAR now", "/etc"):
            err = await _refused(c.prompt(sid, command))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, command
            assert error_info(err).reason == "INVALID_ARGUMENT"
            assert bad_request(err).field_violations[0].field == "text", command
        # Text that starts with a path, or with a space, is a prompt like any other.
        for text in ("/etc/hosts is a file", " /cost"):
            assert result_of(await c.prompt(sid, text)).subtype == "success", text
        assert await c.recall(sid) == ["say one", "/etc/hosts is a file", " /cost", "recall"]
        # Nothing of the refused commands ran: one transcript, the session's own.
        transcripts = list((tmp_path / "claude" / "projects").glob("*/*.jsonl"))
        assert [t.stem for t in transcripts] == [sid]


async def test_compact_runs_ends_its_turn_and_the_session_goes_on(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        before = prompt_id(await c.prompt(sid, "say before"))
        events = await asyncio.wait_for(c.prompt(sid, "/compact"), 60)
        assert result_of(events).subtype == "success"
        assert (await c.get(sid)).state == session_pb2.SESSION_STATE_IDLE
        after = prompt_id(await c.prompt(sid, "say after"))
        # Points before the compaction stay, compacted (test_compaction.py rewinds to them).
        points = await c.points(sid)
        assert [(p.message_id, p.compacted) for p in points.points] == [(before, True), (after, False)]
        transcripts = list((tmp_path / "claude" / "projects").glob("*/*.jsonl"))
        assert [t.stem for t in transcripts] == [sid]


async def test_a_turn_that_ignores_interrupt_is_ended_by_killing_its_process(tmp_path: Path) -> None:
    async with serve(tmp_path, interrupt_timeout=1.0) as c:
        sid = (await c.create()).session_id
        await c.prompt(sid, "say first")
        call = c.sessions.Prompt(
            session_service_pb2.PromptRequest(session_id=sid, text="sleep 30\nsay never")
        )
        stream = call.__aiter__()
        events = [await asyncio.wait_for(stream.__anext__(), 10)]  # the prompt is in the transcript
        [pid] = cli_pids(sid)
        os.kill(pid, signal.SIGSTOP)  # a CLI that answers nothing, Interrupt included
        try:
            await asyncio.wait_for(
                c.sessions.Interrupt(session_service_pb2.InterruptRequest(session_id=sid)), 5
            )
            events += [e async for e in stream]
        finally:
            if pid in cli_pids(sid):
                os.kill(pid, signal.SIGKILL)
        result = result_of(events)
        assert result.interrupted and result.is_error
        assert pid not in cli_pids(sid), "the stuck process was ended"
        # The session resumes in a new process on the next call, with its conversation.
        assert await c.recall(sid) == ["say first", "sleep 30\nsay never", "recall"]
        assert cli_pids(sid) and pid not in cli_pids(sid)


async def test_close_with_force_ends_a_running_turn_and_without_it_is_refused(tmp_path: Path) -> None:
    async with serve(tmp_path, interrupt_timeout=5.0) as c:
        sid = (await c.create()).session_id
        turn = asyncio.ensure_future(c.prompt(sid, "sleep 30\nsay never"))
        await c.wait_for_state(sid, RUNNING)
        err = await _refused(c.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=sid)))
        assert error_info(err).reason == "TURN_IN_FLIGHT"
        closed = await asyncio.wait_for(
            c.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=sid, force=True)), 20
        )
        assert closed.state == CLOSED
        assert result_of(await asyncio.wait_for(turn, 5)).interrupted
        assert cli_pids(sid) == []
        assert await c.recall(sid) == ["sleep 30\nsay never", "recall"]


# 2. A failing ledger write at the end of a turn


@contextmanager
def _ledger_locked(state_dir: Path) -> Iterator[None]:
    """Another writer holds the ledger (as a backup or an operator's shell would): writes fail."""
    db = sqlite3.connect(state_dir / "ledger.sqlite3", isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


async def test_a_turn_whose_bookkeeping_fails_ends_its_stream_and_frees_the_session(tmp_path: Path) -> None:
    async with serve(tmp_path, ledger_busy_timeout=0.2) as c:
        session = await c.create()
        sid = session.session_id
        call = c.sessions.Prompt(
            session_service_pb2.PromptRequest(
                session_id=sid, text="sleep 1\nwrite late.txt done", request_id=str(uuid.uuid4())
            )
        )
        stream = call.__aiter__()
        events = [await asyncio.wait_for(stream.__anext__(), 10)]  # accepted and recorded
        with _ledger_locked(tmp_path):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for event in stream:
                    events.append(event)
            # The stream ended, with an error naming the bookkeeping, not a hang.
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(err.value).reason == "STORAGE_UNAVAILABLE"
            assert "could not be recorded" in (err.value.details() or "")
            assert events and events[-1].HasField("result"), "the turn itself ran to its result"
            assert read(Path(session.cwd) / "late.txt") == "done\n"
            # The lock was released: a rewind is not refused as TURN_IN_FLIGHT (it needs the
            # ledger too, so it fails on that, cleanly).
            rewind = await _refused(c.rewind(sid, prompt_id(events), FILES))
            assert error_info(rewind).reason != "TURN_IN_FLIGHT"
        # Once the disk does, the session works again.
        assert result_of(await c.prompt(sid, "say again")).subtype == "success"
        closed = await c.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=sid))
        assert closed.state == CLOSED


# 3, 4. Intents: a failed completion, a caller gone mid-apply, a shutdown mid-apply


P0, P1, P2 = "write a.txt v0", "edit a.txt v0 => v1\nwrite b.txt bee", "edit a.txt v1 => v2\nwrite c.txt sea"


async def _three_turns(c: Client) -> tuple[str, Path, list[str]]:
    session = await c.create()
    ids = [prompt_id(await c.prompt(session.session_id, p)) for p in (P0, P1, P2)]
    return session.session_id, Path(session.cwd), ids


async def test_a_rewind_whose_completion_failed_is_finished_before_the_next_turn_and_never_cuts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_rewind.store.sqlite import SqliteLedger

    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        failing = SqliteLedger.complete_rewind

        async def fail_once(self: SqliteLedger, *args: Any, **kwargs: Any) -> int:
            monkeypatch.setattr(SqliteLedger, "complete_rewind", failing)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(SqliteLedger, "complete_rewind", fail_once)
        await _refused(c.rewind(sid, ids[1], BOTH))
        assert read(cwd / "a.txt") == "v0\n", "the files half was applied"
        # The next prompt finishes the rewind first, then runs: turns four and five are kept.
        q4 = prompt_id(await c.prompt(sid, "say four"))
        q5 = prompt_id(await c.prompt(sid, "say five"))
        assert [p.message_id for p in (await c.points(sid)).points] == [ids[0], q4, q5]
        rewinds = await c.running.ledger.rewinds(sid) if c.running else []
        assert [r.state for r in rewinds] == ["applied"]
    async with serve(tmp_path) as c:
        assert [p.message_id for p in (await c.points(sid)).points] == [ids[0], q4, q5]
        assert await c.recall(sid) == [P0, "say four", "say five", "recall"]


@pytest.fixture
def slow_restore(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """The CLI takes a second to restore files (the service waits on it); set when it started."""
    from agent_rewind.sessions.worker import SessionWorker

    started = asyncio.Event()
    original = SessionWorker.rewind_files

    async def slow(self: SessionWorker, message_id: str, *, dry_run: bool) -> Any:
        answer = await original(self, message_id, dry_run=dry_run)
        if not dry_run:
            started.set()
            await asyncio.sleep(1.0)
        return answer

    monkeypatch.setattr(SessionWorker, "rewind_files", slow)
    return started


async def test_a_caller_hanging_up_mid_rewind_does_not_cut_it_short(
    tmp_path: Path, slow_restore: asyncio.Event
) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        rid = str(uuid.uuid4())
        call = asyncio.ensure_future(c.rewind(sid, ids[1], BOTH, request_id=rid))
        await asyncio.wait_for(slow_restore.wait(), 10)
        call.cancel()  # the caller hangs up while the files are being restored
        with pytest.raises(asyncio.CancelledError):
            await call
        # The rewind finished all the same: files, conversation, ledger; the retry tells so.
        result = await asyncio.wait_for(c.rewind(sid, ids[1], BOTH, request_id=rid), 10)
        assert result.files.can_rewind and result.conversation.rewound
        assert (read(cwd / "a.txt"), read(cwd / "b.txt")) == ("v0\n", None)
        assert [p.message_id for p in (await c.points(sid)).points] == ids[:1]


async def test_shutdown_waits_for_a_rewind_in_progress(tmp_path: Path, slow_restore: asyncio.Event) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        call = asyncio.ensure_future(c.rewind(sid, ids[1], BOTH))
        await asyncio.wait_for(slow_restore.wait(), 10)
        assert c.running is not None
        await c.running.stop(grace=5)
        # The call got its answer, or lost its server; either way the rewind was not cut short.
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call
    async with serve(tmp_path) as c:
        assert [p.message_id for p in (await c.points(sid)).points] == ids[:1]
        assert read(cwd / "a.txt") == "v0\n"
        assert c.running is not None and [r.state for r in await c.running.ledger.rewinds(sid)] == ["applied"]


# 6. Request ids


async def test_request_ids_are_per_deployment_and_compared_on_every_argument(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        rid = str(uuid.uuid4())
        first = await c.create(request_id=rid, cwd="one")
        assert (await c.create(request_id=rid, cwd="one")).session_id == first.session_id
        err = await _refused(c.create(request_id=rid, cwd="two"))
        assert error_info(err).reason == "REQUEST_ID_REUSED"
        other = (await c.create()).session_id
        prompt_rid = str(uuid.uuid4())
        await c.prompt_events(first.session_id, "say hi", prompt_rid)
        err = await _refused(c.prompt_events(other, "say hi", prompt_rid))
        assert error_info(err).reason == "REQUEST_ID_REUSED", "the same id on another session"
        err = await _refused(c.rewind(other, str(uuid.uuid4()), FILES, request_id=prompt_rid))
        assert error_info(err).reason == "REQUEST_ID_REUSED", "the same id for another method"


async def test_a_retried_prompt_after_a_restart_returns_the_recorded_turn(tmp_path: Path) -> None:
    rid = str(uuid.uuid4())
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        events = await c.prompt_events(sid, "write once.txt one\nsay written", rid)
    (Path(tmp_path) / "workspaces" / sid / "once.txt").unlink()
    async with serve(tmp_path) as c:
        again = await c.prompt_events(sid, "write once.txt one\nsay written", rid)
        assert [e.message_id for e in again if e.HasField("user_prompt")] == [prompt_id(events)]
        assert result_of(again) == result_of(events)
        assert (await c.get(sid)).turn_count == 1, "no second turn ran"
        assert not (Path(tmp_path) / "workspaces" / sid / "once.txt").exists()


# 7. Page tokens


async def test_session_pages_neither_repeat_nor_skip_sessions_created_between_them(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        made = [(await c.create()).session_id for _ in range(4)]
        page = await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest(page_size=2))
        seen = [s.session_id for s in page.sessions]
        newer = (await c.create()).session_id  # created between the pages
        token = page.next_page_token
        while token:
            page = await c.sessions.ListSessions(
                session_service_pb2.ListSessionsRequest(page_size=2, page_token=token)
            )
            seen += [s.session_id for s in page.sessions]
            token = page.next_page_token
        assert seen == list(reversed(made)), "every older session once, newest first"
        assert newer not in seen
        forged = page.next_page_token or "eyJ0IjoiMjAzMCJ9.AAAAAAAAAAAAAAAAAAAAAA"
        err = await _refused(
            c.sessions.ListSessions(session_service_pb2.ListSessionsRequest(page_token=forged))
        )
        assert bad_request(err).field_violations[0].field == "page_token"


# 8. Option types


async def test_option_types_are_checked_at_the_door(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        for bad, field in (
            ({"allowed_tools": [1]}, "options.allowed_tools[0]"),
            ({"max_turns": "many"}, "options.max_turns"),
            ({"max_turns": 2.5}, "options.max_turns"),
            ({"model": ""}, "options.model"),
            ({"thinking": {"type": "enabled"}}, "options.thinking.budget_tokens"),
        ):
            options = struct_pb2.Struct()
            options.update(bad)
            err = await _refused(c.create(options=options))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
            assert bad_request(err).field_violations[0].field == field, bad
        # A null option is an option not set: no TypeError from the SDK, no AGENT_UNAVAILABLE.
        options = struct_pb2.Struct()
        options.update({"allowed_tools": None, "max_turns": 3})
        session = await c.create(options=options)
        assert result_of(await c.prompt(session.session_id, "say ok")).subtype == "success"


# 10. The rewind point arrives with the prompt, not with the model's answer


async def test_the_prompt_event_arrives_before_the_model_answers(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        loop = asyncio.get_running_loop()
        started = loop.time()
        call = c.sessions.Prompt(session_service_pb2.PromptRequest(session_id=sid, text="sleep 4\nsay late"))
        stream: AsyncIterator[session_pb2.TurnEvent] = call.__aiter__()
        first = await asyncio.wait_for(stream.__anext__(), 10)
        took = loop.time() - started
        assert first.HasField("user_prompt") and first.message_id
        assert took < 3, f"the prompt event took {took:.1f} s: it waited for the model's answer"
        # The point exists already, and the turn is still running.
        assert [p.message_id for p in (await c.points(sid)).points] == [first.message_id]
        assert (await c.get(sid)).state == RUNNING
        rest = [e async for e in stream]
        assert rest[-1].HasField("result") and rest[-2].assistant_message.text == "late"
        assert not any(e.HasField("user_prompt") and not e.parent_tool_use_id for e in rest), "sent once"


# 12. Sessions that must work again after any restart or hibernation


async def test_a_session_never_prompted_works_after_a_restart_and_after_hibernation(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
    async with serve(tmp_path, idle_timeout=0.3) as c:
        assert result_of(await c.prompt(sid, "say first")).subtype == "success"
        other = (await c.create()).session_id
        await c.wait_for_state(other, session_pb2.SESSION_STATE_HIBERNATED)
        assert await c.recall(other) == ["recall"]
