"""SessionService against the real server, real Claude Code processes and the scripted model."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import grpc
import pytest

from agent_rewind.api.v1 import session_pb2, session_service_pb2
from tests.integration.harness import (
    RUNNING,
    bad_request,
    cli_pids,
    error_info,
    prompt_id,
    read,
    result_of,
    serve,
    transcript_entries,
)

IDLE = session_pb2.SESSION_STATE_IDLE
HIBERNATED = session_pb2.SESSION_STATE_HIBERNATED
CLOSED = session_pb2.SESSION_STATE_CLOSED


async def test_create_session_gets_a_fresh_workspace_under_the_root_and_a_live_agent(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        session = await c.create()
        assert session.state == IDLE
        assert Path(session.cwd).parent == tmp_path / "workspaces"
        assert Path(session.cwd).is_dir()
        assert session.file_checkpointing is True
        assert session.turn_count == 0 and session.last_message_id == ""
        assert cli_pids(session.session_id), "a live CLI process for the session"


async def test_multi_step_turn_writes_and_edits_files_and_streams_transcript_ids(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        session = await c.create()
        sid = session.session_id
        events = await c.prompt(
            sid, "write notes.txt hello\nwrite todo.txt milk\nedit notes.txt hello => bye\nsay done"
        )
        cwd = Path(session.cwd)
        assert read(cwd / "notes.txt") == "bye\n"
        assert read(cwd / "todo.txt") == "milk\n"
        tools = [
            u.name for e in events if e.HasField("assistant_message") for u in e.assistant_message.tool_uses
        ]
        assert tools == ["Write", "Write", "Read", "Edit"]
        assert sum(1 for e in events if e.HasField("tool_result")) == 4
        result = result_of(events)
        assert result.subtype == "success" and not result.is_error
        assert result.num_turns == 5, "model round trips: four tool calls and the answer"
        assert result.total_cost_usd == 0, "the offline model costs nothing, whatever the CLI counted"
        assert events[-2].assistant_message.text == "done"

        entries = {e["uuid"]: e for e in transcript_entries(tmp_path, sid) if e.get("uuid")}
        pid = prompt_id(events)
        assert entries[pid]["type"] == "user"
        assert "write notes.txt hello" in str(entries[pid]["message"]["content"])
        for event in events[:-1]:
            assert event.message_id in entries, f"streamed id {event.message_id} is not in the transcript"
        assistant = [e for e in events if e.HasField("assistant_message")]
        assert all(e.assistant_message.api_message_id.startswith("msg_") for e in assistant)

        got = await c.get(sid)
        assert got.turn_count == 1
        assert got.last_message_id == assistant[-1].message_id


async def test_second_prompt_while_a_turn_runs_is_refused_with_turn_in_flight(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        first = asyncio.ensure_future(c.prompt(sid, "sleep 2\nsay slow"))
        await c.wait_for_state(sid, RUNNING)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.prompt(sid, "say second")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(err.value).reason == "TURN_IN_FLIGHT"
        assert (await c.get(sid)).state == session_pb2.SESSION_STATE_RUNNING
        assert result_of(await first).subtype == "success"


async def test_interrupt_stops_the_running_turn_and_the_next_turn_runs_only_its_prompt(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        turn = asyncio.ensure_future(c.prompt(sid, "sleep 30\nsay never"))
        await c.wait_for_state(sid, RUNNING)
        await c.sessions.Interrupt(session_service_pb2.InterruptRequest(session_id=sid))
        events = await asyncio.wait_for(turn, 15)
        result = result_of(events)
        assert result.interrupted
        assert not any(e.assistant_message.text == "never" for e in events)
        # The next turn runs its own prompt only: not the interrupted script again (whose
        # 30 s sleep would make it slow), and the model sees both prompts, each once.
        started = asyncio.get_running_loop().time()
        after = await c.prompt(sid, "say after")
        took = asyncio.get_running_loop().time() - started
        assert [e.assistant_message.text for e in after if e.HasField("assistant_message")] == ["after"]
        assert result_of(after).subtype == "success" and not result_of(after).interrupted
        assert took < 15, f"the turn after the interrupt took {took:.1f} s: it re-ran the slept script"
        assert await c.recall(sid) == ["sleep 30\nsay never", "say after", "recall"]
        # The interrupted prompt stays a rewind point (API.md, Round 2 clarifications).
        points = await c.points(sid)
        assert [p.text for p in points.points] == ["sleep 30\nsay never", "say after", "recall"]


async def test_a_turn_runs_on_when_its_caller_stops_listening(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        session = await c.create()
        call = c.sessions.Prompt(
            session_service_pb2.PromptRequest(
                session_id=session.session_id, text="sleep 1\nwrite late.txt yes"
            )
        )
        async for _ in call:
            break  # the prompt event; then hang up
        call.cancel()
        for _ in range(100):
            if (
                read(Path(session.cwd) / "late.txt") == "yes\n"
                and (await c.get(session.session_id)).state == IDLE
            ):
                break
            await asyncio.sleep(0.1)
        assert read(Path(session.cwd) / "late.txt") == "yes\n"


async def test_tools_other_than_edits_run_only_when_allowed_tools_names_them(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        plain = await c.create()
        # The model asks for Bash whether or not it is offered: it does not exist here.
        events = await c.prompt(plain.session_id, 'tool Bash {"command": "echo hi > shell.txt"}')
        denied = [e.tool_result for e in events if e.HasField("tool_result")]
        assert denied and denied[0].is_error and "No such tool available" in denied[0].content
        assert not (Path(plain.cwd) / "shell.txt").exists()

        from google.protobuf import struct_pb2

        options = struct_pb2.Struct()
        options.update({"allowed_tools": ["Bash"]})
        allowed = await c.create(options=options)
        await c.prompt(allowed.session_id, "bash echo hi > shell.txt")
        assert read(Path(allowed.cwd) / "shell.txt") == "hi\n"
        assert dict(allowed.options)["allowed_tools"] == ["Bash"]


async def test_unknown_session_is_session_not_found(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.get("7d3c54b0-2a55-4c39-9a43-0d8e0b1f9a11")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(err.value).reason == "SESSION_NOT_FOUND"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.prompt("7d3c54b0-2a55-4c39-9a43-0d8e0b1f9a11", "say hi")
        assert error_info(err.value).reason == "SESSION_NOT_FOUND"


async def test_malformed_fields_are_invalid_argument_naming_the_field(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.create(session_id="not-a-uuid")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(err.value).reason == "INVALID_ARGUMENT"
        assert bad_request(err.value).field_violations[0].field == "session_id"

        from google.protobuf import struct_pb2

        options = struct_pb2.Struct()
        options.update({"cwd": "/etc"})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.create(options=options)
        assert bad_request(err.value).field_violations[0].field == "options.cwd"

        for bad, field in (
            ({"allowed_tools": 5}, "options.allowed_tools"),
            ({"budget": float("inf")}, "options"),
        ):
            options = struct_pb2.Struct()
            options.update(bad)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.create(options=options)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
            assert bad_request(err.value).field_violations[0].field == field
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.create(cwd="bad\x00name")
        assert bad_request(err.value).field_violations[0].field == "cwd"

        sid = (await c.create()).session_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.prompt(sid, "   ")
        assert bad_request(err.value).field_violations[0].field == "text"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.prompt_events(sid, "say hi", "not-a-uuid")
        assert bad_request(err.value).field_violations[0].field == "request_id"
        assert (await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest())).sessions, (
            "still serving"
        )


async def test_cwd_outside_the_workspace_roots_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with serve(tmp_path / "state") as c:
        root = tmp_path / "state" / "workspaces"
        (root / "link").symlink_to(outside)
        # A sibling whose name starts like the root is outside it (no string-prefix match).
        evil = tmp_path / "state" / "workspaces-evil"
        evil.mkdir()
        for cwd in (
            str(outside),
            str(root / ".." / ".." / "outside"),
            str(root / "link"),
            "../../outside",
            str(evil),
            str(evil / "proj"),
            "../workspaces-evil",
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.create(cwd=cwd)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, cwd
            assert error_info(err.value).reason == "WORKSPACE_OUTSIDE_ROOT", cwd
        inside = await c.create(cwd=str(root / "proj"))
        assert inside.cwd == str(root / "proj")
        assert (await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest())).sessions[
            0
        ].session_id == (inside.session_id)


async def test_killed_agent_answers_agent_unavailable_and_the_session_recovers(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        await c.prompt(sid, "say first")
        turn = asyncio.ensure_future(c.prompt(sid, "sleep 30\nsay never"))
        await c.wait_for_state(sid, RUNNING)
        pids = cli_pids(sid)
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(turn, 15)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(err.value).reason == "AGENT_UNAVAILABLE"
        # The server stays up and the session resumes in a new process.
        assert (await c.get(sid)).state == HIBERNATED
        events = await c.prompt(sid, "say again")
        assert result_of(events).subtype == "success"
        assert "say first" in await c.recall(sid)


async def test_close_ends_the_agent_and_the_session_stays_readable(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        await c.prompt(sid, "say one")
        closed = await c.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=sid))
        assert closed.state == CLOSED
        for _ in range(50):
            if not cli_pids(sid):
                break
            await asyncio.sleep(0.1)
        assert not cli_pids(sid)
        got = await c.get(sid)
        assert got.state == CLOSED and got.turn_count == 1


async def test_idle_session_hibernates_and_resumes_with_its_context(tmp_path: Path) -> None:
    async with serve(tmp_path, idle_timeout=0.5) as c:
        sid = (await c.create()).session_id
        await c.prompt(sid, "say remember me")
        for _ in range(100):
            if (await c.get(sid)).state == HIBERNATED and not cli_pids(sid):
                break
            await asyncio.sleep(0.1)
        assert (await c.get(sid)).state == HIBERNATED
        assert not cli_pids(sid), "the idle session gave its process back"
        assert await c.recall(sid) == ["say remember me", "recall"]


async def test_sessions_survive_a_restart_of_the_service(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        await c.prompt(sid, "write a.txt one")
    async with serve(tmp_path) as c:
        session = await c.get(sid)
        assert session.state == HIBERNATED and session.turn_count == 1
        assert await c.recall(sid) == ["write a.txt one", "recall"]


async def test_stray_anthropic_environment_does_not_reach_the_offline_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-not-a-real-key")
    monkeypatch.setenv("ANTHROPIC_MODEL", "no-such-model")
    async with serve(tmp_path) as c:
        sid = (await c.create()).session_id
        assert result_of(await c.prompt(sid, "say offline")).subtype == "success"


async def test_create_is_idempotent_by_request_id_and_sessions_are_paged(tmp_path: Path) -> None:
    import uuid

    async with serve(tmp_path) as c:
        rid = str(uuid.uuid4())
        first = await c.create(request_id=rid)
        again = await c.create(request_id=rid)
        assert again.session_id == first.session_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.create(request_id=rid, enable_file_checkpointing=False)
        assert error_info(err.value).reason == "REQUEST_ID_REUSED"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.create(session_id=first.session_id)
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert error_info(err.value).reason == "SESSION_ALREADY_EXISTS"
        chosen = str(uuid.uuid4())
        assert (await c.create(session_id=chosen)).session_id == chosen

        request = session_service_pb2.ListSessionsRequest(page_size=1)
        seen = []
        while True:
            page = await c.sessions.ListSessions(request)
            assert len(page.sessions) <= 1
            seen += [s.session_id for s in page.sessions]
            if not page.next_page_token:
                break
            request = session_service_pb2.ListSessionsRequest(page_size=1, page_token=page.next_page_token)
        assert seen == [chosen, first.session_id], "newest first, each once"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest(page_token="garbage"))
        assert bad_request(err.value).field_violations[0].field == "page_token"


async def test_an_unusual_workspace_path_up_to_the_bound_still_finds_its_transcript(tmp_path: Path) -> None:
    """The CLI names a transcript's directory after the workspace, a character beyond U+FFFF as
    two (JavaScript's count); past PROJECT_NAME_MAX it would shorten it its own way, so such a
    workspace is refused (test_isolation.py)."""
    from agent_rewind.api.v1 import rewind_service_pb2
    from agent_rewind.transcript.paths import PROJECT_NAME_MAX, project_name

    async with serve(tmp_path) as c:
        crab = "a crab \U0001f980 here"
        left = PROJECT_NAME_MAX - len(project_name(str(tmp_path / "workspaces" / crab)))
        parts = -(-left // 51)  # components of at most 50 characters, each after a slash
        letters = left - parts
        at_bound = "/".join([crab] + ["d" * (letters // parts + (i < letters % parts)) for i in range(parts)])
        assert len(project_name(str(tmp_path / "workspaces" / at_bound))) == PROJECT_NAME_MAX
        for cwd in (at_bound, "my project_v2.0 (ünïcode)"):
            session = await c.create(cwd=cwd)
            await c.prompt(session.session_id, "say hi")
            points = await c.rewinds.ListRewindPoints(
                rewind_service_pb2.ListRewindPointsRequest(session_id=session.session_id)
            )
            assert [p.text for p in points.points] == ["say hi"], cwd
            assert (await c.get(session.session_id)).turn_count == 1


async def test_a_retried_prompt_with_its_request_id_reattaches_to_the_same_turn(tmp_path: Path) -> None:
    import uuid

    async with serve(tmp_path) as c:
        session = await c.create()
        sid = session.session_id
        rid = str(uuid.uuid4())
        text = "sleep 1\nwrite once.txt one\nsay written"
        call = c.sessions.Prompt(session_service_pb2.PromptRequest(session_id=sid, text=text, request_id=rid))
        async for _ in call:
            break  # the connection drops after the first event
        call.cancel()
        retry = c.sessions.Prompt(
            session_service_pb2.PromptRequest(session_id=sid, text=text, request_id=rid)
        )
        events = [e async for e in retry]
        assert events[0].HasField("user_prompt") and result_of(events).subtype == "success"
        assert read(Path(session.cwd) / "once.txt") == "one\n"
        assert (await c.get(sid)).turn_count == 1, "the retry ran no second turn"
        # After the turn, the same request id still replays it; with another text it is refused.
        again = await c.prompt_events(sid, text, rid)
        assert [e.message_id for e in again] == [e.message_id for e in events]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.prompt_events(sid, "say other", rid)
        assert error_info(err.value).reason == "REQUEST_ID_REUSED"


async def test_file_tools_cannot_reach_outside_the_workspace(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    async with serve(tmp_path / "state") as c:
        session = await c.create()
        cwd = Path(session.cwd)
        (cwd / "link").symlink_to(outside)
        attempts = {
            f"write {outside}/abs.txt x": outside / "abs.txt",
            "write ../escape.txt x": cwd.parent / "escape.txt",
            "write link/through-link.txt x": outside / "through-link.txt",
        }
        for prompt, target in attempts.items():
            events = await c.prompt(session.session_id, prompt)
            results = [e.tool_result for e in events if e.HasField("tool_result")]
            assert results and all(r.is_error for r in results), prompt
            assert not target.exists(), prompt
        for prompt in (f"read {outside}/secret.txt", "read link/secret.txt"):
            events = await c.prompt(session.session_id, prompt)
            results = [e.tool_result for e in events if e.HasField("tool_result")]
            assert results and results[0].is_error and "secret" not in results[0].content, prompt
        # Inside the workspace the same tools work.
        await c.prompt(session.session_id, "write inside.txt ok")
        assert read(cwd / "inside.txt") == "ok\n"
