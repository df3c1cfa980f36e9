"""When a session's process starts (sessions/lifecycle.py, over sessions/process.py): on
demand, fresh the first time and resumed at the visible leaf after, replaced when it died, with a
ClientSpec carrying the session's stored options; and what a conversation cut, an undo or a files
rewind does to the live process (cut in place, or let go and a new one resumed in the background).

The harness (a fake client, a ledger that fails on demand) is in harness.py and conftest.py.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from agent_rewind.errors import AgentUnavailable
from agent_rewind.sessions.adapter import AgentError
from agent_rewind.sessions.turn_events import ConversationAnswer, FilesAnswer, ResultEvent
from agent_rewind.sessions.worker import State
from agent_rewind.store.ledger import Anchor, NewSession
from agent_rewind.testing.fake_agent import append as _append
from agent_rewind.testing.fake_agent import prompt_entry as _prompt_entry
from agent_rewind.testing.fake_agent import reply_entry as _reply_entry
from agent_rewind.transcript.paths import transcript_path
from tests.unit.sessions.harness import (
    CLI_ENV,
    FlakyLedger,
    MakeWorker,
    _cut_recorded,
    collect,
    setup,
    within,
)

# The client


async def test_first_client_start_is_fresh_and_marks_the_session_started(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    worker, factory = await make_worker()
    assert worker.state == State.HIBERNATED
    async with worker.exclusive():
        client = await worker.ensure_client()
    assert client is factory.last
    assert factory.specs[0].resume is False
    assert worker.state == State.IDLE
    record = await ledger.session(worker.session_id)
    assert record is not None and record.started
    assert worker.record.started


async def test_ensure_client_reuses_a_live_client(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    async with worker.exclusive():
        first = await worker.ensure_client()
        again = await worker.ensure_client()
    assert again is first
    assert len(factory.clients) == 1


async def test_a_dead_client_is_replaced_by_one_resuming_at_the_visible_leaf(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    first = factory.last
    first.die()
    assert worker.state == State.HIBERNATED

    async with worker.exclusive():
        second = await worker.ensure_client()
    assert second is not first
    assert len(factory.clients) == 2
    spec = factory.specs[1]
    assert spec.resume is True
    assert spec.session_id == worker.session_id
    assert spec.resume_session_at == (await worker.view()).leaf == first.leaf
    assert first.closed
    assert worker.state == State.IDLE


async def test_a_prompt_after_the_process_died_resumes_in_a_new_client(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    factory.last.die()

    events = await collect(await within(worker.start_turn("two")))
    assert isinstance(events[-1], ResultEvent)
    assert [s.resume for s in factory.specs] == [False, True]
    assert factory.clients[1].prompts == ["two"]
    assert [p.text for p in (await worker.view()).points] == ["one", "two"]


async def test_client_start_failure_raises_agent_unavailable(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    worker, _ = await make_worker(
        factory=setup(start_error=AgentError("the Claude Code CLI did not start: boom"))
    )
    with pytest.raises(AgentUnavailable) as caught:
        async with worker.exclusive():
            await worker.ensure_client()
    assert "boom" in caught.value.message
    assert caught.value.metadata == {"session_id": worker.session_id}
    assert worker.state == State.HIBERNATED
    record = await ledger.session(worker.session_id)
    assert record is not None and not record.started


# The ClientSpec


async def test_client_spec_carries_stored_options_verbatim_and_checkpointing(make_worker: MakeWorker) -> None:
    options = {
        "model": "claude-test",
        "max_turns": 5,
        "allowed_tools": ["Read", "Bash"],
        "system_prompt": {"type": "preset", "preset": "claude_code", "append": "be brief"},
    }
    worker, factory = await make_worker(options=options, checkpointing=False)
    async with worker.exclusive():
        await worker.ensure_client()
    spec = factory.specs[0]
    assert spec.options == options
    assert spec.checkpointing is False
    assert spec.session_id == worker.session_id
    assert spec.cwd == Path(worker.record.cwd)
    assert dict(spec.env) == CLI_ENV
    assert spec.project_settings is False
    assert spec.stderr is not None


async def test_client_spec_keeps_checkpointing_on_when_stored(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker(checkpointing=True)
    async with worker.exclusive():
        await worker.ensure_client()
    assert factory.specs[0].checkpointing is True


async def test_client_spec_follows_the_operators_project_settings(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker(project_settings=True)
    async with worker.exclusive():
        await worker.ensure_client()
    assert factory.specs[0].project_settings is True


async def test_without_a_conversation_in_the_transcript_the_cli_starts_fresh_under_the_session_id(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    """Even a session whose CLI ran before: with no conversation to resume, resuming would fail."""
    worker, factory = await make_worker()
    await ledger.touch_session(worker.session_id, started=True)
    async with worker.exclusive():
        await worker.ensure_client()
    spec = factory.specs[0]
    assert spec.resume is False
    assert spec.resume_session_at is None
    assert spec.session_id == worker.session_id


async def test_a_resume_is_pinned_at_the_visible_leaf(make_worker: MakeWorker) -> None:
    """Not a plain resume: a crash that kept the CLI from marking its newest leaf must never
    bring back turns the service does not show."""
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    await collect(await within(worker.start_turn("two")))
    leaf = (await worker.view()).leaf
    assert leaf == factory.last.leaf
    await within(worker.hibernate())
    await collect(await within(worker.start_turn("three")))
    assert factory.specs[-1].resume is True
    assert factory.specs[-1].resume_session_at == leaf
    assert [p.text for p in (await worker.view()).points] == ["one", "two", "three"]


async def test_client_spec_resumes_at_a_pending_ledger_anchor(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path
) -> None:
    sid = str(uuid.uuid4())
    cwd = tmp_path / "workspaces" / sid
    cwd.mkdir(parents=True)
    await ledger.add_session(NewSession(sid, str(cwd), {"model": "m"}, True))
    await ledger.touch_session(sid, started=True)
    p1, a1, p2, a2 = (str(uuid.uuid4()) for _ in range(4))
    path = transcript_path(tmp_path / "claude", str(cwd), sid)
    _append(path, _prompt_entry(p1, None, "one"), _reply_entry(a1, p1, "1"))
    _append(path, _prompt_entry(p2, a1, "two"), _reply_entry(a2, p2, "2"))
    # A conversation rewind to "two": the conversation ends at the entry before it.
    anchor = Anchor(sid, a1, p2, path.stat().st_size, None, "rewind-1")
    await _cut_recorded(ledger, sid, anchor)

    worker, factory = await make_worker(session_id=sid)
    assert (await worker.view()).last_message_id == a1  # the cut shows before any client runs
    async with worker.exclusive():
        await worker.ensure_client()
    spec = factory.specs[0]
    assert spec.resume is True
    assert spec.resume_session_at == a1
    assert spec.options == {"model": "m"}
    assert await ledger.anchor(sid) == anchor  # still pending: no new turn has written the cut yet

    # The next turn writes the cut into the transcript itself: the ledger lets it go.
    await collect(await within(worker.start_turn("three")))
    assert await ledger.anchor(sid) is None
    assert [p.text for p in (await worker.view()).points] == ["one", "three"]


# Conversation cuts, undos and files rewinds


async def test_a_cut_the_live_process_accepts_keeps_the_process(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    client = factory.last
    async with worker.exclusive():
        await worker.view()
        await within(worker.cut_conversation("prompt-x"))
    assert client.cut_calls == [("prompt-x", client.prompt_ids[-1])], "told the newest prompt it has seen"
    assert worker.client_pid == client.pid and not client.closed
    assert len(factory.clients) == 1


async def test_a_cut_the_live_process_refuses_resumes_a_new_one_in_the_background(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    old = factory.last
    old.cut_answer = ConversationAnswer(False, "turn_running", "busy")
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
        assert worker.client_pid is None, "let go at once"
    await factory.until(lambda: len(factory.clients) == 2 and factory.last.alive and old.closed)
    assert factory.last.spec.resume


async def test_a_cut_without_a_live_process_starts_none(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
    await asyncio.sleep(0.05)  # nothing to await for what must not happen
    assert factory.clients == []


async def test_a_cut_that_fails_in_the_live_process_resumes_a_new_one(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    old = factory.last
    old.cut_error = AgentError("broken pipe")
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
        assert worker.client_pid is None, "let go at once"
    await factory.until(lambda: len(factory.clients) == 2 and factory.last.alive and old.closed)
    assert factory.last.spec.resume


async def test_an_undo_lets_the_live_process_go_and_resumes_a_new_one_in_the_background(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    old = factory.last
    async with worker.exclusive():
        worker.conversation_restored()
        assert worker.client_pid is None, "let go at once"
    await factory.until(lambda: len(factory.clients) == 2 and factory.last.alive and old.closed)
    assert factory.last.spec.resume


async def test_an_undo_without_a_live_process_starts_none(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    async with worker.exclusive():
        worker.conversation_restored()
    await asyncio.sleep(0.05)  # nothing to await for what must not happen
    assert factory.clients == []


async def test_a_session_closed_before_its_background_resume_runs_gets_no_process(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    factory.last.cut_answer = ConversationAnswer(False, "turn_running", "busy")
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
    await within(worker.close())  # before the background resume had the lock
    await within(asyncio.gather(*worker._background))
    assert len(factory.clients) == 1
    assert worker.state == State.CLOSED


async def test_rewind_files_gives_the_clis_answer_and_a_failure_lets_the_process_go(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    async with worker.exclusive():
        assert await worker.rewind_files("prompt-x", dry_run=True) == FilesAnswer(can_rewind=True)

        async def broken(message_id: str, *, dry_run: bool) -> FilesAnswer:
            raise AgentError("broken pipe")

        factory.last.rewind_files = broken  # type: ignore[method-assign]
        with pytest.raises(AgentUnavailable, match="broken pipe"):
            await worker.rewind_files("prompt-x", dry_run=False)
        assert worker.client_pid is None
