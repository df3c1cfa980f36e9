"""RewindService end to end: real server, real Claude Code processes, the scripted model."""

from __future__ import annotations

import asyncio
import importlib.metadata
import uuid
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2
from agent_rewind.sessions.adapter import SdkAgentClient
from agent_rewind.sessions.turn_events import FilesAnswer
from tests.integration.harness import (
    BOTH,
    CONVERSATION,
    FILES,
    RUNNING,
    Client,
    error_info,
    prompt_id,
    read,
    serve,
    transcript_entries,
)

P0 = "write a.txt v0\nsay made a"
P1 = "edit a.txt v0 => v1\nwrite b.txt bee\nsay edited a, made b"
P2 = "edit a.txt v1 => v2\nwrite c.txt sea\nsay edited a, made c"


async def _three_turns(c: Client) -> tuple[str, Path, list[str]]:
    session = await c.create()
    ids = [prompt_id(await c.prompt(session.session_id, p)) for p in (P0, P1, P2)]
    cwd = Path(session.cwd)
    assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v2\n", "bee\n", "sea\n")
    return session.session_id, cwd, ids


async def test_points_are_the_prompts_oldest_first_with_their_anchors(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, _, ids = await _three_turns(c)
        page = await c.points(sid)
        assert [p.message_id for p in page.points] == ids
        assert [p.index for p in page.points] == [0, 1, 2]
        assert page.points[0].resume_at_message_id == ""
        assert all(p.resume_at_message_id for p in page.points[1:])
        assert page.points[1].text == P1
        assert all(p.files_rewindable for p in page.points)
        assert page.last_message_id == (await c.get(sid)).last_message_id != ""
        first = await c.points(sid, page_size=2)
        assert [p.index for p in first.points] == [0, 1] and first.next_page_token
        assert [p.message_id for p in await c.all_points(sid)] == ids


async def test_files_rewind_restores_edited_files_and_deletes_created_ones(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        result = await c.rewind(sid, ids[1], FILES)
        assert result.rewind_id and result.files.can_rewind and not result.conversation.requested
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v0\n", None, None)
        # The conversation is untouched.
        assert [p.message_id for p in (await c.points(sid)).points] == ids
        assert await c.recall(sid) == [P0, P1, P2, "recall"]


async def test_both_rewinds_files_and_conversation_to_a_middle_point(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        before = await c.points(sid)
        result = await c.rewind(sid, ids[1], BOTH)
        assert result.files.can_rewind and result.conversation.rewound
        assert result.conversation.messages_dropped > 0
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v0\n", None, None)
        after = await c.points(sid)
        assert [p.message_id for p in after.points] == ids[:1]
        assert after.last_message_id == result.last_message_id != before.last_message_id
        assert (await c.get(sid)).last_message_id == result.last_message_id
        assert await c.recall(sid) == [P0, "recall"]
        # Hidden, not deleted: the transcript keeps the dropped turns as an abandoned branch.
        uuids = {e.get("uuid") for e in transcript_entries(tmp_path, sid)}
        assert set(ids) <= uuids


async def test_conversation_rewind_drops_later_points_and_the_model_forgets_them(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        result = await c.rewind(sid, ids[2], CONVERSATION)
        assert result.conversation.rewound and not result.files.requested
        assert read(cwd / "c.txt") == "sea\n", "files are left alone"
        assert [p.message_id for p in (await c.points(sid)).points] == ids[:2]
        assert await c.recall(sid) == [P0, P1, "recall"]
        points = await c.points(sid)
        assert [p.text for p in points.points] == [P0, P1, "recall"]


async def test_dry_run_reports_the_diffstat_and_drop_count_and_changes_nothing(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        before = await c.points(sid)
        result = await c.dry_run(sid, ids[1], BOTH)
        assert result.rewind_id == ""
        assert result.files.can_rewind
        assert sorted(Path(f).name for f in result.files.files_changed) == ["a.txt", "b.txt", "c.txt"]
        assert result.files.insertions >= 1 and result.files.deletions >= 1
        assert result.conversation.can_rewind and not result.conversation.rewound
        assert result.conversation.messages_dropped > 0
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v2\n", "bee\n", "sea\n")
        assert await c.points(sid) == before
        applied = await c.rewind(sid, ids[1], BOTH)
        assert applied.conversation.messages_dropped == result.conversation.messages_dropped
        assert applied.last_message_id == result.last_message_id


async def test_conversation_rewind_is_durable_across_a_restart_before_the_next_prompt(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, _, ids = await _three_turns(c)
        await c.rewind(sid, ids[1], CONVERSATION)
    async with serve(tmp_path) as c:
        assert [p.message_id for p in (await c.points(sid)).points] == ids[:1]
        assert (await c.get(sid)).turn_count == 1
    async with serve(tmp_path) as c:
        assert await c.recall(sid) == [P0, "recall"]
    async with serve(tmp_path) as c:
        # Now the cut is in the transcript itself; a plain resume keeps it.
        assert [p.text for p in (await c.points(sid)).points] == [P0, "recall"]
        assert await c.recall(sid) == [P0, "recall", "recall"]


async def test_assistant_api_ids_resolve_to_their_turn_also_after_a_restart(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        session = await c.create()
        sid = session.session_id
        await c.prompt(sid, P0)
        events = await c.prompt(sid, P1)
        api_id = next(e.assistant_message.api_message_id for e in events if e.HasField("assistant_message"))
        await c.prompt(sid, P2)
    async with serve(tmp_path) as c:
        result = await c.dry_run(sid, api_id, CONVERSATION)
        by_uuid = await c.dry_run(sid, prompt_id(events), CONVERSATION)
        assert result.conversation.messages_dropped == by_uuid.conversation.messages_dropped > 0


async def test_refusals_carry_their_reasons(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        events = await c.prompt(sid, "write d.txt dee")
        tool_result_id = next(e.message_id for e in events if e.HasField("tool_result"))

        async def refused(
            message_id: str, mode: int, **kw: object
        ) -> tuple[grpc.StatusCode, str, dict[str, str]]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.rewind(sid, message_id, mode, **kw)
            info = error_info(err.value)
            return err.value.code(), info.reason, dict(info.metadata)

        code, reason, _ = await refused(ids[0], CONVERSATION)
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NO_CONVERSATION_ANCHOR")
        code, reason, _ = await refused(tool_result_id, FILES)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "NOT_A_REWIND_POINT")
        code, reason, _ = await refused(str(uuid.uuid4()), FILES)
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "MESSAGE_NOT_FOUND")
        # Neither a UUID nor a msg_ id: a malformed field.
        code, reason, meta = await refused("hello", FILES)
        assert (code, reason, meta["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            "message_id",
        )
        last = (await c.points(sid)).last_message_id
        code, reason, meta = await refused(ids[1], BOTH, expected_last_message_id=ids[0])
        assert (code, reason, meta["last_message_id"]) == (grpc.StatusCode.ABORTED, "REWIND_CONFLICT", last)
        # The dry run reports a refused half inside the result, not as an error.
        dry = await c.dry_run(sid, ids[0], BOTH)
        assert dry.files.can_rewind and not dry.conversation.can_rewind
        assert dry.conversation.refusal.reason == "NO_CONVERSATION_ANCHOR"
        # Nothing was applied by any of them.
        assert (read(cwd / "a.txt"), read(cwd / "d.txt")) == ("v2\n", "dee\n")
        assert len((await c.points(sid)).points) == 4
        # A matching expectation goes through.
        ok = await c.rewind(sid, ids[2], CONVERSATION, expected_last_message_id=last)
        assert ok.conversation.rewound


async def test_rewind_while_a_turn_runs_is_refused(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, _, ids = await _three_turns(c)
        turn = asyncio.ensure_future(c.prompt(sid, "sleep 2\nsay slow"))
        await c.wait_for_state(sid, RUNNING)
        for call in (c.rewind, c.dry_run):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(sid, ids[1], BOTH)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error_info(err.value).reason == "TURN_IN_FLIGHT"
        await turn
        assert len((await c.points(sid)).points) == 4


async def test_request_id_makes_rewind_idempotent(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        rid = str(uuid.uuid4())
        first = await c.rewind(sid, ids[2], BOTH, request_id=rid)
        await c.prompt(sid, "write c.txt again")
        again = await c.rewind(sid, ids[2], BOTH, request_id=rid)
        assert again == first
        assert read(cwd / "c.txt") == "again\n", "the repeat applied nothing"
        # A retry answers with the first result even while a turn runs.
        turn = asyncio.ensure_future(c.prompt(sid, "sleep 1\nsay busy"))
        await c.wait_for_state(sid, RUNNING)
        assert await c.rewind(sid, ids[2], BOTH, request_id=rid) == first
        await turn
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, ids[1], BOTH, request_id=rid)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(err.value).reason == "REQUEST_ID_REUSED"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, ids[1], BOTH, request_id="not-a-uuid")
        assert error_info(err.value).reason == "INVALID_ARGUMENT"


async def test_without_checkpointing_files_are_refused_and_both_leaves_the_conversation(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        session = await c.create(enable_file_checkpointing=False)
        sid = session.session_id
        assert not session.file_checkpointing
        # Checkpointing off is the caller's last word on file tracking: no snapshots either.
        assert not session.workspace_snapshots
        ids = [prompt_id(await c.prompt(sid, p)) for p in (P0, P1)]
        assert not any(p.files_rewindable for p in (await c.points(sid)).points)
        for mode in (FILES, BOTH):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.rewind(sid, ids[1], mode)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error_info(err.value).reason == "CHECKPOINTING_DISABLED"
        assert [p.message_id for p in (await c.points(sid)).points] == ids
        assert await c.recall(sid) == [P0, P1, "recall"]
        # The conversation half alone still works.
        rewound = await c.rewind(sid, ids[1], CONVERSATION)
        assert rewound.conversation.rewound
        undone = await c.rewinds.UndoRewind(
            rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewound.rewind_id)
        )
        assert undone.conversation.rewound
        # Nothing of the workspace was ever kept, for the rewind nor its undo: no snapshot
        # repository (where a session that takes snapshots has one).
        tracked = await c.create()
        await c.prompt(tracked.session_id, P0)
        assert (tmp_path / "snapshots" / f"{tracked.session_id}.git").is_dir()
        assert not (tmp_path / "snapshots" / f"{sid}.git").exists()


async def test_many_rewinds_back_and_forth_stay_consistent(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        await c.rewind(sid, ids[2], BOTH)  # back to before P2
        assert (read(cwd / "a.txt"), read(cwd / "c.txt")) == ("v1\n", None)
        q2 = prompt_id(await c.prompt(sid, "edit a.txt v1 => w2\nwrite e.txt eee"))
        q3 = prompt_id(await c.prompt(sid, "edit a.txt w2 => w3"))
        assert read(cwd / "a.txt") == "w3\n"
        assert [p.message_id for p in (await c.points(sid)).points] == [ids[0], ids[1], q2, q3]
        # To a point created after the first rewind.
        await c.rewind(sid, q3, BOTH)
        assert (read(cwd / "a.txt"), read(cwd / "e.txt")) == ("w2\n", "eee\n")
        assert await c.recall(sid) == [P0, P1, "edit a.txt v1 => w2\nwrite e.txt eee", "recall"]
        # To an older point, past both branches.
        await c.rewind(sid, ids[1], BOTH)
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "e.txt")) == ("v0\n", None, None)
        assert [p.message_id for p in (await c.points(sid)).points] == ids[:1]
        # Dropped points cannot be targeted again.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, q2, FILES)
        assert error_info(err.value).reason == "MESSAGE_NOT_FOUND"
        await c.prompt(sid, "edit a.txt v0 => z1")
        assert await c.recall(sid) == [P0, "edit a.txt v0 => z1", "recall"]
        assert read(cwd / "a.txt") == "z1\n"
    async with serve(tmp_path) as c:
        assert [p.text for p in (await c.points(sid)).points] == [P0, "edit a.txt v0 => z1", "recall"]


async def test_checkpoints_older_than_the_window_are_refused_as_unavailable(tmp_path: Path) -> None:
    """The CLI keeps file checkpoints for the 100 most recent prompts (SDK-FACTS.md)."""
    async with serve(tmp_path) as c:
        session = await c.create()
        sid = session.session_id
        ids = [prompt_id(await c.prompt(sid, "write old.txt zero"))]
        for n in range(1, 103):
            ids.append(prompt_id(await c.prompt(sid, f"say {n}")))
        points = await c.all_points(sid)
        assert len(points) == 103
        # Exactly the 100 newest: the boundary as the points report it and as the CLI answers.
        assert [p.files_rewindable for p in points] == [False] * 3 + [True] * 100
        assert not (await c.dry_run(sid, ids[2], FILES)).files.can_rewind
        assert (await c.dry_run(sid, ids[3], FILES)).files.can_rewind
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, ids[0], FILES)
        info = error_info(err.value)
        assert (err.value.code(), info.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "FILE_CHECKPOINT_UNAVAILABLE",
        )
        assert info.metadata["sdk_error"]
        dry = await c.dry_run(sid, ids[0], BOTH)
        assert (
            dry.files.refusal.reason == "FILE_CHECKPOINT_UNAVAILABLE" and dry.conversation.can_rewind is False
        )
        assert read(Path(session.cwd) / "old.txt") == "zero\n"
        assert (await c.rewind(sid, ids[-1], FILES)).files.can_rewind


async def test_a_crash_between_the_halves_is_finished_on_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        rid = str(uuid.uuid4())
        assert c.running is not None
        ledger = type(c.running.ledger)  # the session owner's (test_rewind_replicated.py: PostgreSQL)

        async def crash(*args: object, **kwargs: object) -> None:
            raise RuntimeError("simulated crash after the files half")

        with monkeypatch.context() as patch:
            patch.setattr(ledger, "complete_rewind", crash)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.rewind(sid, ids[1], BOTH, request_id=rid)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert error_info(err.value).reason == "INTERNAL"
        assert "Traceback" not in (err.value.details() or "")
        # Files went first; the conversation half was not recorded.
        assert (read(cwd / "a.txt"), read(cwd / "c.txt")) == ("v0\n", None)
    async with serve(tmp_path) as c:
        # The restart finished the recorded intent: the conversation is cut too.
        assert [p.message_id for p in (await c.points(sid)).points] == ids[:1]
        again = await c.rewind(sid, ids[1], BOTH, request_id=rid)
        assert again.rewind_id and again.conversation.rewound and again.files.can_rewind
        assert await c.recall(sid) == [P0, "recall"]


async def test_capabilities_describe_this_deployment(tmp_path: Path) -> None:
    from agent_rewind.api.v1 import rewind_service_pb2

    async with serve(tmp_path, replica_id="solo") as c:
        caps = await c.rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        assert caps.replicas == 1 and (await c.create()).replica == "solo"
        assert list(caps.modes) == [FILES, CONVERSATION, BOTH]
        assert caps.file_checkpoint_window == 100
        assert caps.dry_run and caps.events
        assert caps.undo_rewind and caps.prompt_rewind and caps.fork_session and caps.delete_session
        assert caps.model_backend == "offline", "the scripted model says so"
        # What is installed, whichever version that is (make compat runs this on others).
        assert caps.sdk_version == importlib.metadata.version("claude-agent-sdk") and caps.cli_version


async def test_two_conversation_rewinds_in_a_row_then_a_prompt(tmp_path: Path) -> None:
    """The second cut drops one visible turn but two in the transcript: the resume must accept it."""
    async with serve(tmp_path) as c:
        sid, _, ids = await _three_turns(c)
        assert (await c.rewind(sid, ids[2], CONVERSATION)).conversation.messages_dropped > 0
        await c.rewind(sid, ids[1], CONVERSATION)
        assert [p.message_id for p in (await c.points(sid)).points] == ids[:1]
        assert await c.recall(sid) == [P0, "recall"]


async def test_a_closed_session_can_be_rewound_and_a_prompt_reopens_it(tmp_path: Path) -> None:
    from agent_rewind.api.v1 import session_pb2, session_service_pb2

    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        await c.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=sid))
        result = await c.rewind(sid, ids[2], BOTH)
        assert result.files.can_rewind and result.conversation.rewound
        assert (read(cwd / "a.txt"), read(cwd / "c.txt")) == ("v1\n", None)
        assert (await c.get(sid)).state == session_pb2.SESSION_STATE_CLOSED
        assert await c.recall(sid) == [P0, P1, "recall"]
        assert (await c.get(sid)).state == session_pb2.SESSION_STATE_IDLE


def _agent_allowed() -> struct_pb2.Struct:
    """A session that may start subagents: they exist only when named (sessions/tools.py)."""
    options = struct_pb2.Struct()
    options.update({"allowed_tools": ["Agent"]})
    return options


async def test_subagent_messages_are_streamed_but_are_not_rewind_points(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        session = await c.create(options=_agent_allowed())
        sid = session.session_id
        await c.prompt(sid, P0)
        events = await c.prompt(sid, "agent write sub.txt from the subagent\nsay delegated")
        sub = [e for e in events if e.parent_tool_use_id]
        assert any(e.HasField("user_prompt") for e in sub), "the subagent's prompt is streamed"
        assert read(Path(session.cwd) / "sub.txt") == "from the subagent\n"
        points = await c.points(sid)
        assert [p.text for p in points.points] == [P0, "agent write sub.txt from the subagent\nsay delegated"]
        sub_prompt = next(e.message_id for e in sub if e.HasField("user_prompt"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, sub_prompt, CONVERSATION)
        assert error_info(err.value).reason == "NOT_A_REWIND_POINT"
        # The turn that started the subagent is the point.
        result = await c.rewind(sid, prompt_id(events), CONVERSATION)
        assert result.conversation.rewound
        assert await c.recall(sid) == [P0, "recall"]


async def test_a_conversation_rewind_cuts_the_live_process_in_place(tmp_path: Path) -> None:
    """No new process: the CLI drops the turns from the live one, so the next prompt finds it ready."""
    from agent_rewind.testing.processes import cli_pids

    async with serve(tmp_path) as c:
        sid, _, ids = await _three_turns(c)
        before = cli_pids(sid)
        assert len(before) == 1
        result = await c.rewind(sid, ids[2], CONVERSATION)
        assert result.conversation.rewound
        assert cli_pids(sid) == before, "the same process, and no second one"
        assert await c.recall(sid) == [P0, P1, "recall"]
        assert cli_pids(sid) == before


async def test_a_both_rewind_whose_conversation_half_is_refused_restores_no_file(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        before = await c.points(sid)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, ids[0], BOTH)  # the files half alone could be applied
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(err.value).reason == "NO_CONVERSATION_ANCHOR"
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v2\n", "bee\n", "sea\n")
        assert await c.points(sid) == before


async def test_points_are_paged_by_their_tokens(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        session = await c.create()
        sid = session.session_id
        ids = [prompt_id(await c.prompt(sid, f"say {n}")) for n in range(5)]
        seen: list[str] = []
        request = rewind_service_pb2.ListRewindPointsRequest(session_id=sid, page_size=2)
        pages = 0
        while True:
            page = await c.rewinds.ListRewindPoints(request)
            pages += 1
            seen += [p.message_id for p in page.points]
            if not page.next_page_token:
                break
            request = rewind_service_pb2.ListRewindPointsRequest(
                session_id=sid, page_size=2, page_token=page.next_page_token
            )
        assert (seen, pages) == (ids, 3)
        # A token is bound to its list: another session's listing refuses it.
        other = (await c.create()).session_id
        token = (await c.points(sid, page_size=2)).next_page_token
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewinds.ListRewindPoints(
                rewind_service_pb2.ListRewindPointsRequest(session_id=other, page_token=token)
            )
        assert error_info(err.value).reason == "INVALID_ARGUMENT"
        assert error_info(err.value).metadata["field"] == "page_token"


async def test_messages_dropped_counts_every_visible_message_of_the_dropped_turns(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        session = await c.create()
        sid = session.session_id
        await c.prompt(sid, P0)
        dropped_turns = [await c.prompt(sid, P1), await c.prompt(sid, P2)]
        # Every message a turn streams (prompt, assistant messages, tool results) is a message
        # of the conversation; the result is not.
        streamed = {e.message_id for events in dropped_turns for e in events if e.message_id}
        dry = await c.dry_run(sid, prompt_id(dropped_turns[0]), CONVERSATION)
        assert dry.conversation.messages_dropped == len(streamed)
        result = await c.rewind(sid, prompt_id(dropped_turns[0]), BOTH)
        assert result.conversation.messages_dropped == len(streamed)


async def test_not_a_rewind_point_names_what_the_message_is(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        session = await c.create(options=_agent_allowed())
        sid = session.session_id
        await c.prompt(sid, P0)
        events = await c.prompt(sid, "write d.txt dee\nagent say from the subagent")
        kinds = {
            "tool_result": next(e.message_id for e in events if e.HasField("tool_result")),
            "subagent_message": next(
                e.message_id for e in events if e.parent_tool_use_id and e.HasField("user_prompt")
            ),
            "assistant_message": next(
                e.message_id for e in events if e.HasField("assistant_message") and not e.parent_tool_use_id
            ),
        }
        for kind, message_id in kinds.items():
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.rewind(sid, message_id, FILES)
            info = error_info(err.value)
            assert (err.value.code(), info.reason, info.metadata["kind"]) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "NOT_A_REWIND_POINT",
                kind,
            ), message_id


async def test_a_crash_after_the_files_half_is_finished_without_restoring_the_files_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        rid = str(uuid.uuid4())
        assert c.running is not None
        ledger = type(c.running.ledger)  # the session owner's (test_rewind_replicated.py: PostgreSQL)

        async def crash(*args: object, **kwargs: object) -> None:
            raise RuntimeError("simulated crash after the files half")

        with monkeypatch.context() as patch:
            patch.setattr(ledger, "complete_rewind", crash)
            with pytest.raises(grpc.aio.AioRpcError):
                await c.rewind(sid, ids[1], BOTH, request_id=rid)
        assert read(cwd / "a.txt") == "v0\n"
    # Someone edits a restored file while the service is down.
    (cwd / "a.txt").write_text("edited by hand\n")
    async with serve(tmp_path) as c:
        again = await c.rewind(sid, ids[1], BOTH, request_id=rid)
        assert again.conversation.rewound
        assert read(cwd / "a.txt") == "edited by hand\n", "recovery did not restore the files a second time"


async def test_a_files_rewind_restores_a_file_a_dropped_branch_created_and_a_visible_turn_changed(
    tmp_path: Path,
) -> None:
    """The CLI alone would leave x.txt as the dropped turn wrote it: to its own chain the file
    existed before t1. It did not: only the dropped t2 made it."""
    async with serve(tmp_path) as c:
        session = await c.create()
        sid, cwd = session.session_id, Path(session.cwd)
        t1 = prompt_id(await c.prompt(sid, "write base.txt one"))
        t2 = prompt_id(await c.prompt(sid, "write x.txt a"))
        await c.rewind(sid, t2, CONVERSATION)  # drops t2; x.txt stays as t2 wrote it
    async with serve(tmp_path) as c:
        t3 = prompt_id(await c.prompt(sid, "write x.txt b"))
        assert read(cwd / "x.txt") == "b\n"
        dry = await c.dry_run(sid, t1, FILES)
        assert sorted(Path(f).name for f in dry.files.files_changed) == ["base.txt", "x.txt"]
        await c.rewind(sid, t1, FILES)
        assert (read(cwd / "base.txt"), read(cwd / "x.txt")) == (None, None)
        assert [p.message_id for p in (await c.points(sid)).points] == [t1, t3]


def _cli_requests(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The rewind_files requests sent to the CLI from now on: whether each was a dry run."""
    sent: list[bool] = []
    real = SdkAgentClient.rewind_files

    async def spy(self: SdkAgentClient, message_id: str, *, dry_run: bool) -> FilesAnswer:
        sent.append(dry_run)
        return await real(self, message_id, dry_run=dry_run)

    monkeypatch.setattr(SdkAgentClient, "rewind_files", spy)
    return sent


async def test_a_files_rewind_sends_the_cli_no_dry_run_and_reports_what_its_dry_run_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned from the files the CLI tracks, read before and after the restore (no dry run):
    the files changed and their line counts are the CLI's own preview's, for files edited,
    created by a later turn, and created by a dropped branch then changed by a visible turn."""
    async with serve(tmp_path) as c:
        sid, cwd, ids = await _three_turns(c)
        dropped = prompt_id(await c.prompt(sid, "write d.txt one\nwrite e.txt x"))
        await c.rewind(sid, dropped, CONVERSATION)  # d.txt and e.txt stay as the dropped turn wrote them
        await c.prompt(sid, "edit d.txt one => two\nwrite f.txt 1\nsay again")
        sent = _cli_requests(monkeypatch)
        for target in (ids[2], ids[1]):
            dry = await c.dry_run(sid, target, FILES)
            assert sent == [True]
            sent.clear()
            result = await c.rewind(sid, target, FILES)
            assert sent == [False], "the restore alone"
            sent.clear()
            assert sorted(result.files.files_changed) == sorted(dry.files.files_changed) != []
            assert all(Path(f).parent == cwd for f in result.files.files_changed)
            assert (result.files.insertions, result.files.deletions) == (
                dry.files.insertions,
                dry.files.deletions,
            )
            assert result.files.source == rewind_pb2.FILES_SOURCE_CHECKPOINT
            again = await c.dry_run(sid, target, FILES)
            assert list(again.files.files_changed) == [], "nothing left to restore"
            sent.clear()
        assert [read(cwd / n) for n in ("a.txt", "b.txt", "c.txt", "d.txt", "e.txt", "f.txt")] == [
            "v0\n", None, None, None, None, None
        ]  # fmt: skip


async def test_a_tracked_file_made_a_link_is_never_read_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hostile: a file the CLI tracks is replaced by a link to a file outside the workspace. The
    service reads nothing through it, and neither the rewind nor its preview tells anything of
    the file it names (the CLI's own preview counts that file's lines). The link goes, as the
    file did not exist at the point; the CLI's restore skips it, and counts it."""
    outside = tmp_path / "secret.txt"
    outside.write_text("".join(f"line {i}\n" for i in range(50)))
    async with serve(tmp_path) as c:
        session = await c.create()
        sid, cwd = session.session_id, Path(session.cwd)
        t1 = prompt_id(await c.prompt(sid, "write a.txt one"))
        await c.prompt(sid, "edit a.txt one => two\nwrite b.txt bee\nsay edited")
        (cwd / "a.txt").unlink()
        (cwd / "a.txt").symlink_to(outside)
        dry = await c.dry_run(sid, t1, FILES)
        assert sorted(Path(f).name for f in dry.files.files_changed) == ["a.txt", "b.txt"]
        assert (dry.files.insertions, dry.files.deletions) == (0, 0), "counts through a link are not told"
        sent = _cli_requests(monkeypatch)
        result = await c.rewind(sid, t1, FILES)
        assert sent == [False], "planned without the CLI"
        assert sorted(Path(f).name for f in result.files.files_changed) == ["a.txt", "b.txt"]
        assert (result.files.insertions, result.files.deletions, result.files.skipped_links) == (0, 1, 1)
        assert not (cwd / "a.txt").is_symlink() and read(cwd / "b.txt") is None
        assert outside.read_text().count("\n") == 50, "the file the link named is left alone"


async def test_a_page_that_ends_at_the_last_point_has_no_next_token(tmp_path: Path) -> None:
    """The next token is for a page that has points: none after a page ending exactly at the end."""
    async with serve(tmp_path) as c:
        sid, _, ids = await _three_turns(c)
        whole = await c.points(sid, page_size=3)
        assert [p.message_id for p in whole.points] == ids and whole.next_page_token == ""
        first = await c.points(sid, page_size=2)
        assert first.next_page_token
        second = await c.rewinds.ListRewindPoints(
            rewind_service_pb2.ListRewindPointsRequest(
                session_id=sid, page_size=2, page_token=first.next_page_token
            )
        )
        assert [p.message_id for p in second.points] == ids[2:] and second.next_page_token == ""


@pytest.mark.parametrize("position", [{"i": -1}, {"i": "2"}, {}], ids=["negative", "not_a_number", "none"])
async def test_a_signed_page_token_with_a_position_no_list_has_is_refused(
    tmp_path: Path, position: dict[str, object]
) -> None:
    """Defence behind the signature: a token signed with the service's own key (a key that
    leaked, a bug that issued one) whose position is not a place in the list is refused, never
    read as one."""
    from agent_rewind.rpc.requests import PageTokens

    async with serve(tmp_path) as c:
        sid, _, _ = await _three_turns(c)
        assert c.running is not None
        tokens = PageTokens(await c.running.ledger.secret("page_tokens"))
        forged = tokens.issue(f"points:{sid}", position)
        request = rewind_service_pb2.ListRewindPointsRequest(session_id=sid, page_token=forged)
        if position == {}:  # no position: the list's start
            page = await c.rewinds.ListRewindPoints(request)
            assert [p.index for p in page.points] == [0, 1, 2]
            return
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewinds.ListRewindPoints(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(err.value).metadata["field"] == "page_token"


async def test_capabilities_name_the_hosts_commands_may_reach(tmp_path: Path) -> None:
    async with serve(tmp_path, sandbox_allow_hosts=["api.example.com", "*.pypi.org"]) as c:
        caps = await c.rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        assert caps.sandbox.enabled
        assert list(caps.sandbox.allowed_hosts) == ["api.example.com", "*.pypi.org"]
