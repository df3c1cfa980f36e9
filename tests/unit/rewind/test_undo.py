"""UndoRewind through the engine: files and conversation back as they were just before the rewind,
its preview, its request id, what refuses it, someone else's edits, and restores that fail.

Real turns of the worker with a fake CLI whose agent writes files, the server's real workspace
snapshots (a git store in tmp_path; an undo keeps what it needs there) and a real SQLite ledger.
tests/integration/test_history.py drives the same through a real server and real Claude Code.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from agent_rewind.errors import AgentRewindError, FilesUnavailable, RequestIdReused, UndoUnavailable
from agent_rewind.rewind.outcome import ConversationHalf, FilesHalf, Mode
from agent_rewind.rewind.workspace import SKIP
from agent_rewind.snapshots import files
from tests.unit.rewind.fakes import SOON, MakeSetup, Setup, crash_once, within

P0 = {"a.txt": "v0\n"}
P1 = {"a.txt": "v1\n", "b.txt": "bee\n"}
P2 = {"a.txt": "v2\n", "c.txt": "sea\n"}
AFTER = ("v2\n", "bee\n", "sea\n")


async def _three_turns(s: Setup) -> list[str]:
    return [await s.prompt(text, edits) for text, edits in (("zero", P0), ("one", P1), ("two", P2))]


def _files(s: Setup) -> tuple[str | None, ...]:
    return (s.read("a.txt"), s.read("b.txt"), s.read("c.txt"))


def _abs(s: Setup, *names: str) -> tuple[str, ...]:
    return tuple(str(s.cwd / name) for name in names)


async def _snapshot_session(make_setup: MakeSetup) -> tuple[Setup, list[str]]:
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    return s, await _three_turns(s)


async def test_an_undo_brings_back_the_files_and_the_conversation(make_setup: MakeSetup) -> None:
    s, ids = await _snapshot_session(make_setup)
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.BOTH)))
    assert _files(s) == ("v0\n", None, None)

    preview = await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id, validate_only=True)))
    assert preview.rewind_id == rewound.rewind_id
    assert preview.files.requested and preview.files.can_rewind and preview.files.source == "snapshot"
    assert preview.files.files_changed == _abs(s, "a.txt", "b.txt", "c.txt")
    assert (preview.files.insertions, preview.files.deletions) == (3, 1)
    assert preview.conversation == ConversationHalf(True, True, False, 0), "a preview cuts nothing"
    assert preview.last_message_id == ids[2]
    assert _files(s) == ("v0\n", None, None) and await s.texts() == ["zero"], "a preview applies nothing"
    assert [r.kind for r in await s.ledger.rewinds(s.sid)] == ["rewind"]

    undone = await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert undone.files == preview.files
    assert undone.conversation == ConversationHalf(True, True, True, 0)
    assert undone.last_message_id == ids[2]
    assert _files(s) == AFTER
    assert await s.texts() == ["zero", "one", "two"]
    assert [(e.kind, e.rewind_id) for e in s.published] == [
        ("REWOUND", rewound.rewind_id),
        ("UNDONE", rewound.rewind_id),
    ]
    assert await s.pending() == []


async def test_what_an_undo_put_back_is_the_services_and_a_later_edit_is_someone_elses(
    make_setup: MakeSetup,
) -> None:
    """The snapshots record the undo as the service's interval: rewinding again is served by them
    with no conflict; an edit made after the undo is someone else's, and refuses the rewind."""
    s, ids = await _snapshot_session(make_setup)
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    (s.cwd / "c.txt").write_text("a person's\n")
    with pytest.raises(AgentRewindError) as caught:
        await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    assert caught.value.reason == "EXTERNAL_CHANGES"
    (s.cwd / "c.txt").write_text("sea\n")  # as the undo left it
    again = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    assert again.files.source == "snapshot" and again.files.conflicts == ()
    assert _files(s) == ("v0\n", None, None)


async def test_an_undo_of_a_conversation_rewind_brings_back_the_conversation_only(
    make_setup: MakeSetup,
) -> None:
    s, ids = await _snapshot_session(make_setup)
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.CONVERSATION)))
    undone = await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert undone.files == FilesHalf()
    assert undone.conversation.rewound and undone.last_message_id == ids[2]
    assert await s.texts() == ["zero", "one", "two"]
    assert _files(s) == AFTER


@pytest.mark.parametrize("absolute", [False, True])
async def test_an_undo_of_a_files_rewind_the_clis_checkpoints_served(
    make_setup: MakeSetup, absolute: bool
) -> None:
    """The files the rewind changes were kept before it, under their workspace paths, whether the
    CLI names them relative or absolute. A session without workspace snapshots gets none."""
    s = await make_setup(snapshots=True, workspace_snapshots=False)
    s.knobs.files_changed = (str(s.cwd / "a.txt"),) if absolute else ("a.txt",)
    s.knobs.checkpoint = {"a.txt": "as the checkpoint holds it\n"}
    await s.prompt("one")
    two = await s.prompt("two", {"a.txt": "mine\n"})
    rewound = await within(s.engine.rewind(s.worker, s.request(two, Mode.FILES)))
    assert rewound.files.source == "checkpoint" and s.read("a.txt") == "as the checkpoint holds it\n"

    undone = await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert s.read("a.txt") == "mine\n"
    assert undone.files.requested and undone.files.can_rewind and undone.files.source == "checkpoint"
    assert undone.files.files_changed == _abs(s, "a.txt")
    assert undone.conversation == ConversationHalf()
    assert undone.last_message_id == (await s.worker.view()).last_message_id == two
    assert await s.ledger.snapshots(s.sid) == []


async def test_a_rewind_that_changed_a_file_outside_the_workspace_cannot_be_undone(
    make_setup: MakeSetup,
) -> None:
    s = await make_setup(snapshots=True, workspace_snapshots=False)
    s.knobs.files_changed = ("a.txt", str(s.tmp_path / "elsewhere.txt"))
    await s.prompt("one")
    two = await s.prompt("two")
    rewound = await within(s.engine.rewind(s.worker, s.request(two, Mode.FILES)))
    with pytest.raises(UndoUnavailable) as caught:
        await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert "not captured" in caught.value.message


async def test_an_undo_needs_a_server_with_snapshots(make_setup: MakeSetup) -> None:
    s, ids = await _snapshot_session(make_setup)
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    await s.restart(snapshots=False)
    with pytest.raises(UndoUnavailable) as caught:
        await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert "not captured" in caught.value.message
    assert _files(s) == ("v0\n", None, None)


async def test_a_rewind_a_server_without_snapshots_finishes_is_applied_and_cannot_be_undone(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its intent kept the files as they were, but the server that finishes it (after a crash)
    has no snapshots to keep them as it leaves them: the rewind is applied all the same."""
    s = await make_setup(snapshots=True, workspace_snapshots=False)
    s.knobs.checkpoint = {"a.txt": "as the checkpoint holds it\n"}
    await s.prompt("one")
    two = await s.prompt("two", {"a.txt": "mine\n"})
    crash_once(monkeypatch, s.ledger, "complete_rewind")
    with pytest.raises(RuntimeError):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.FILES)))
    [pending] = await s.pending()
    assert pending.plan["undo"] is not None, "the intent kept the files as they were"

    await s.restart(snapshots=False)
    await within(s.engine.recover({s.sid: s.worker}))
    assert await s.pending() == []
    record = await s.ledger.rewind(pending.rewind_id)
    assert record is not None and record.state == "applied" and record.result is not None
    assert "undo" not in record.result
    assert s.read("a.txt") == "as the checkpoint holds it\n"
    with pytest.raises(UndoUnavailable) as caught:
        await within(s.engine.undo(s.worker, s.undo_request(pending.rewind_id)))
    assert "not captured" in caught.value.message


# Request ids


async def test_a_retry_of_an_undo_gets_its_result_without_waiting_for_the_session(
    make_setup: MakeSetup,
) -> None:
    s, ids = await _snapshot_session(make_setup)
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.BOTH)))
    rid = str(uuid.uuid4())
    undone = await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id, request_id=rid)))
    async with asyncio.timeout(SOON), s.worker.lock:  # a turn holds the session
        again = await s.engine.undo(s.worker, s.undo_request(rewound.rewind_id, request_id=rid))
    assert again == undone
    assert [r.kind for r in await s.ledger.rewinds(s.sid)] == ["rewind", "undo"], "undone once"
    with pytest.raises(RequestIdReused):
        await within(
            s.engine.undo(s.worker, s.undo_request(rewound.rewind_id, request_id=rid, conflict_policy=SKIP))
        )
    with pytest.raises(UndoUnavailable) as caught:
        await within(
            s.engine.undo(s.worker, s.undo_request(rewound.rewind_id, request_id=rid, validate_only=True))
        )
    assert "undone already" in caught.value.message, "a preview is judged anew"


# What refuses an undo


async def test_only_the_latest_rewind_can_be_undone_and_an_undo_cannot_be(make_setup: MakeSetup) -> None:
    s, ids = await _snapshot_session(make_setup)
    first = await within(s.engine.rewind(s.worker, s.request(ids[2], Mode.FILES)))
    second = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))

    async def refusal(rewind_id: str) -> str:
        with pytest.raises(UndoUnavailable) as caught:
            await within(s.engine.undo(s.worker, s.undo_request(rewind_id)))
        return caught.value.message

    assert "no such applied rewind" in await refusal(str(uuid.uuid4()))
    assert "not the session's latest rewind" in await refusal(first.rewind_id)
    await within(s.engine.undo(s.worker, s.undo_request(second.rewind_id)))
    assert "undone already" in await refusal(second.rewind_id)
    assert "not the session's latest rewind" in await refusal(first.rewind_id), "the undo undid another"
    [undo] = [r for r in await s.ledger.rewinds(s.sid) if r.kind == "undo"]
    assert "an undo cannot be undone" in await refusal(undo.rewind_id)


async def test_an_undo_is_refused_after_a_turn(make_setup: MakeSetup) -> None:
    s, ids = await _snapshot_session(make_setup)
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    await s.prompt("three")
    with pytest.raises(UndoUnavailable) as caught:
        await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert "a turn ran after it" in caught.value.message


async def test_files_changed_since_the_rewind_are_refused_or_skipped(make_setup: MakeSetup) -> None:
    s, ids = await _snapshot_session(make_setup)
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    (s.cwd / "a.txt").write_text("a person's\n")
    with pytest.raises(AgentRewindError) as caught:
        await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert caught.value.reason == "EXTERNAL_CHANGES"
    assert _files(s) == ("a person's\n", None, None), "nothing applied"
    skipped = await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id, conflict_policy=SKIP)))
    assert skipped.files.conflicts == (("a.txt", "skipped"),)
    assert skipped.files.files_changed == _abs(s, "b.txt", "c.txt")
    assert _files(s) == ("a person's\n", "bee\n", "sea\n")


# Restores that fail


async def test_an_undo_whose_restore_is_rolled_back_changes_nothing(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone writes b.txt between the undo's intent and its restore."""
    s, ids = await _snapshot_session(make_setup)
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.BOTH)))
    begin = s.ledger.begin_rewind

    async def begin_then_edit(*args: Any, **kwargs: Any) -> None:
        await begin(*args, **kwargs)
        (s.cwd / "b.txt").write_text("written meanwhile\n")

    monkeypatch.setattr(s.ledger, "begin_rewind", begin_then_edit)
    with pytest.raises(FilesUnavailable) as caught:
        await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert "nothing was changed" in caught.value.message
    assert _files(s) == ("v0\n", "written meanwhile\n", None)
    assert [r.kind for r in await s.ledger.rewinds(s.sid)] == ["rewind"] and await s.pending() == []
    assert await s.texts() == ["zero"]


async def test_an_undo_left_half_done_is_finished_and_its_retry_gets_the_result(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, ids = await _snapshot_session(make_setup)
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.BOTH)))

    def full(self: files.Workspace, path: str, mode: str, chunks: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.Workspace, "write", full)
    request = s.undo_request(rewound.rewind_id, request_id=str(uuid.uuid4()))
    with pytest.raises(FilesUnavailable) as caught:
        await within(s.engine.undo(s.worker, request))
    assert "partly back" in caught.value.message
    [pending] = await s.pending()
    assert pending.kind == "undo"
    assert await s.texts() == ["zero"], "the conversation waits for the files"

    monkeypatch.undo()  # the disk has room again
    undone = await within(s.engine.undo(s.worker, request))
    assert undone.rewind_id == rewound.rewind_id and undone.conversation.rewound
    assert await s.pending() == []
    record = await s.ledger.rewind(pending.rewind_id)
    assert record is not None and record.state == "applied"
    assert _files(s) == AFTER
    assert await s.texts() == ["zero", "one", "two"]
