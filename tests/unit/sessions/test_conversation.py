"""A session's view of its transcript (sessions/conversation.py): read inline when the unread part is
small and in a thread when it is large, found where the CLI wrote it, and cut where a rewind left
it until a new turn writes the cut into the transcript itself, which is let go only once that
transcript is on disk.

The harness (a fake client, a ledger that fails on demand) is in harness.py and conftest.py.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.store.ledger import Anchor, NewSession
from agent_rewind.testing.fake_agent import append as _append
from agent_rewind.testing.fake_agent import prompt_entry as _prompt_entry
from agent_rewind.testing.fake_agent import reply_entry as _reply_entry
from agent_rewind.transcript.paths import transcript_path
from tests.unit.sessions.harness import FlakyLedger, MakeWorker, _cut_recorded, collect, within

# Reading the transcript


async def test_a_large_transcript_is_read_off_the_event_loop(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long session's first read must not stall every other session on the loop."""
    import agent_rewind.sessions.conversation as worker_module

    worker, _factory = await make_worker()
    path = transcript_path(worker._ctx.claude_config_dir, worker.record.cwd, worker.session_id)
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "hello"))

    calls: list[str] = []
    real_to_thread = asyncio.to_thread

    async def spy(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(worker_module.asyncio, "to_thread", spy)
    monkeypatch.setattr(worker_module, "READ_INLINE_BYTES", 10)
    view = await worker.view()
    assert len(view.points) == 1
    assert "refresh" in calls, "the read ran in a thread"


async def test_a_small_transcript_is_read_inline(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_rewind.sessions.conversation as worker_module

    worker, _factory = await make_worker()
    path = transcript_path(worker._ctx.claude_config_dir, worker.record.cwd, worker.session_id)
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "hello"))
    calls: list[str] = []
    real_to_thread = asyncio.to_thread

    async def spy(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(worker_module.asyncio, "to_thread", spy)
    assert len((await worker.view()).points) == 1
    assert "refresh" not in calls


def _reads_in_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records what runs in a thread (asyncio.to_thread) from here on."""
    calls: list[str] = []
    real_to_thread = asyncio.to_thread

    async def spy(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    return calls


async def test_a_small_append_to_a_large_transcript_already_read_is_read_inline(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What decides is the unread part, not the file's size."""
    import agent_rewind.sessions.conversation as worker_module

    worker, _ = await make_worker()
    path = transcript_path(worker._ctx.claude_config_dir, worker.record.cwd, worker.session_id)
    _append(path, *(_prompt_entry(str(uuid.uuid4()), None, f"prompt {i}") for i in range(4)))
    calls = _reads_in_threads(monkeypatch)
    monkeypatch.setattr(worker_module, "READ_INLINE_BYTES", path.stat().st_size // 2)
    assert len((await worker.view()).points) == 1
    assert calls.count("refresh") == 1, "the large first read ran in a thread"
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "small"))
    assert [p.text for p in (await worker.view()).points] == ["small"]
    assert calls.count("refresh") == 1, "the small append was read inline"


async def test_an_unread_part_of_exactly_the_inline_bound_is_read_inline(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_rewind.sessions.conversation as worker_module

    worker, _ = await make_worker()
    path = transcript_path(worker._ctx.claude_config_dir, worker.record.cwd, worker.session_id)
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "hello"))
    calls = _reads_in_threads(monkeypatch)
    monkeypatch.setattr(worker_module, "READ_INLINE_BYTES", path.stat().st_size)
    assert len((await worker.view()).points) == 1
    assert "refresh" not in calls


async def test_a_transcript_the_cli_writes_under_a_directory_of_its_own_is_found_later(
    make_worker: MakeWorker, tmp_path: Path
) -> None:
    """Looked for before the CLI wrote it (under a name of its own for a long project path),
    the transcript is found once it exists."""
    worker, _ = await make_worker()
    assert len((await worker.view()).points) == 0
    computed = worker.transcript_file
    assert not computed.exists()
    path = tmp_path / "claude" / "projects" / "shortened-by-the-cli" / f"{worker.session_id}.jsonl"
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "hello"))
    assert [p.text for p in (await worker.view()).points] == ["hello"]
    assert worker.transcript_file == path != computed


# A conversation cut, kept in the ledger until the transcript holds it


async def _pending_cut(ledger: FlakyLedger, tmp_path: Path) -> tuple[str, Path, Anchor, list[str]]:
    """A session of two turns whose conversation was cut back to the first (pending in the ledger)."""
    sid = str(uuid.uuid4())
    cwd = tmp_path / "workspaces" / sid
    cwd.mkdir(parents=True)
    await ledger.add_session(NewSession(sid, str(cwd), {}, True))
    await ledger.touch_session(sid, started=True)
    ids = [str(uuid.uuid4()) for _ in range(4)]
    p1, a1, p2, a2 = ids
    path = transcript_path(tmp_path / "claude", str(cwd), sid)
    _append(path, _prompt_entry(p1, None, "one"), _reply_entry(a1, p1, "1"))
    _append(path, _prompt_entry(p2, a1, "two"), _reply_entry(a2, p2, "2"))
    anchor = Anchor(sid, a1, p2, path.stat().st_size, None, "rewind-1")
    await _cut_recorded(ledger, sid, anchor)
    return sid, path, anchor, ids


async def test_8_the_cut_is_let_go_only_after_the_transcript_holding_it_is_fsynced(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger's cut is what keeps a rewind durable until the transcript itself holds it on
    disk: clearing it before the transcript's fsync, a crash could bring the dropped turn back."""
    sid, path, _anchor, _ = await _pending_cut(ledger, tmp_path)
    # What happened to the transcript, in order: each fsync with the size it made durable.
    order: list[tuple[str, int]] = []
    real_fsync, real_clear = os.fsync, ledger.clear_anchor

    def fsync(fd: int) -> None:
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(path):
            order.append(("fsync", os.fstat(fd).st_size))
        real_fsync(fd)

    async def clear(session_id: str, anchor_uuid: str) -> None:
        order.append(("clear cut", path.stat().st_size))
        await real_clear(session_id, anchor_uuid)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(ledger, "clear_anchor", clear)
    worker, _ = await make_worker(session_id=sid)
    await collect(await within(worker.start_turn("three")))
    await worker.view()
    assert await ledger.anchor(sid) is None
    (cleared,) = [i for i, (what, _) in enumerate(order) if what == "clear cut"]
    size = order[cleared][1]
    assert ("fsync", size) in order[:cleared], (
        f"the transcript as it holds the cut was fsynced first: {order}"
    )


async def test_9_the_cut_stays_until_a_whole_new_turn_is_written_past_it(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path
) -> None:
    """Bookkeeping the CLI writes on resume, even a prompt without its turn, does not put the cut
    in the transcript: only a new turn's prompt chained through the anchor does."""
    sid, path, anchor, (_p1, a1, p2, _a2) = await _pending_cut(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid)
    # Entries appended after the cut that are not a turn: a last-prompt record, an attachment.
    _append(path, {"type": "last-prompt", "leafUuid": a1, "sessionId": sid})
    _append(path, {"type": "attachment", "uuid": str(uuid.uuid4()), "parentUuid": a1, "sessionId": sid})
    assert (await worker.view()).last_message_id == a1
    assert await ledger.anchor(sid) == anchor, "no new turn yet: the cut stays in the ledger"
    # The dropped prompt written again past the cut (a resumed CLI replaying it) is not a new turn.
    _append(path, _prompt_entry(p2, a1, "two"))
    await worker.view()
    assert await ledger.anchor(sid) == anchor
    # A new turn's prompt chained through the anchor is.
    p3 = str(uuid.uuid4())
    _append(path, _prompt_entry(p3, a1, "three"), _reply_entry(str(uuid.uuid4()), p3, "3"))
    assert [p.text for p in (await worker.view()).points] == ["one", "three"]
    assert await ledger.anchor(sid) is None


async def test_a_cut_is_let_go_once_a_new_prompt_alone_is_written_past_it(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path
) -> None:
    """The CLI writes a turn's prompt before its answer: that prompt, chained through the anchor
    and the first entry past the cut, already puts the cut in the transcript."""
    sid, path, _anchor, (_p1, a1, _p2, _a2) = await _pending_cut(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid)
    p3 = str(uuid.uuid4())
    _append(path, _prompt_entry(p3, a1, "three"))
    assert [p.text for p in (await worker.view()).points] == ["one", "three"]
    assert await ledger.anchor(sid) is None


async def test_a_prompt_past_the_cut_that_does_not_continue_from_its_anchor_leaves_the_cut(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path
) -> None:
    """A new conversation root written past the cut does not hold the cut: the ledger keeps it."""
    sid, path, anchor, (_p1, a1, _p2, _a2) = await _pending_cut(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid)
    root = str(uuid.uuid4())
    _append(path, _prompt_entry(root, None, "elsewhere"), _reply_entry(str(uuid.uuid4()), root, "x"))
    assert (await worker.view()).last_message_id == a1
    assert await ledger.anchor(sid) == anchor
