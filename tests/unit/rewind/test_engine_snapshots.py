"""Files rewinds served by the server's workspace snapshots, through the engine: what is restored,
what someone else changed, when the CLI's checkpoints serve instead, and restores that fail.

Real turns of the worker with a fake CLI whose agent writes files, the server's real snapshots (a
git store in tmp_path) and a real SQLite ledger. tests/integration/test_snapshots.py drives the
same through a real server and real Claude Code processes.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent_rewind.errors import AgentRewindError, FilesUnavailable, StorageUnavailable
from agent_rewind.metrics import REGISTRY
from agent_rewind.rewind.outcome import FilesHalf, Mode
from agent_rewind.rewind.workspace import OVERWRITE, SKIP
from agent_rewind.snapshots import Limits, files
from agent_rewind.snapshots.taking import REWIND_AFTER, REWIND_BEFORE, TURN_END, TURN_START
from tests.unit.rewind.fakes import MakeSetup, Setup, within

P0 = {"a.txt": "v0\n"}
P1 = {"a.txt": "v1\n", "b.txt": "bee\n"}
P2 = {"a.txt": "v2\n", "c.txt": "sea\n"}


async def _three_turns(s: Setup) -> list[str]:
    return [await s.prompt(text, edits) for text, edits in (("zero", P0), ("one", P1), ("two", P2))]


def _files(s: Setup) -> tuple[str | None, ...]:
    return (s.read("a.txt"), s.read("b.txt"), s.read("c.txt"))


def _abs(s: Setup, *names: str) -> tuple[str, ...]:
    return tuple(str(s.cwd / name) for name in names)


async def test_a_files_rewind_is_served_by_the_snapshots_as_its_dry_run_said(make_setup: MakeSetup) -> None:
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    ids = await _three_turns(s)
    preview = await within(s.engine.dry_run(s.worker, s.request(ids[1], Mode.FILES)))
    assert preview.files.requested and preview.files.can_rewind and preview.files.source == "snapshot"
    assert preview.files.files_changed == _abs(s, "a.txt", "b.txt", "c.txt")
    assert (preview.files.insertions, preview.files.deletions) == (1, 3)
    assert preview.files.diffs == (), "diffs only when asked"
    shown = await within(s.engine.dry_run(s.worker, s.request(ids[1], Mode.FILES, include_diff=True)))
    assert sorted(d["path"] for d in shown.files.diffs) == ["a.txt", "b.txt", "c.txt"]
    assert _files(s) == ("v2\n", "bee\n", "sea\n"), "a dry run writes nothing"

    outcome = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    assert outcome.files == preview.files
    assert _files(s) == ("v0\n", None, None)
    assert s.knobs.applied == [], "the CLI's checkpoints were not asked"
    kinds = [(r.kind, r.ref) for r in await s.ledger.snapshots(s.sid)]
    assert kinds[-2:] == [(REWIND_BEFORE, outcome.rewind_id), (REWIND_AFTER, outcome.rewind_id)]
    # The restore was the service's doing, and its after snapshot is complete: the first point
    # is still served by the snapshots, with no conflict.
    again = await within(s.engine.rewind(s.worker, s.request(ids[0], Mode.FILES)))
    assert again.files.source == "snapshot" and again.files.conflicts == ()
    assert _files(s) == (None, None, None)


async def test_a_rewind_of_both_halves_restores_the_files_from_the_snapshots_and_cuts(
    make_setup: MakeSetup,
) -> None:
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    ids = await _three_turns(s)
    outcome = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.BOTH)))
    assert outcome.files.source == "snapshot" and outcome.conversation.rewound
    assert outcome.last_message_id == ids[0]
    assert _files(s) == ("v0\n", None, None)
    assert await s.texts() == ["zero"]
    record = await s.ledger.rewind(outcome.rewind_id)
    assert record is not None and record.files_applied


async def test_an_edit_made_outside_the_agent_is_refused_skipped_or_overwritten(
    make_setup: MakeSetup,
) -> None:
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    ids = await _three_turns(s)
    (s.cwd / "a.txt").write_text("a person's\n")

    preview = await within(s.engine.dry_run(s.worker, s.request(ids[1], Mode.FILES)))
    assert preview.files.requested and not preview.files.can_rewind
    assert preview.files.refusal is not None and preview.files.refusal.reason == "EXTERNAL_CHANGES"
    assert preview.files.conflicts == (("a.txt", "refused"),)
    with pytest.raises(AgentRewindError) as caught:
        await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    assert caught.value.reason == "EXTERNAL_CHANGES"
    assert _files(s) == ("a person's\n", "bee\n", "sea\n"), "nothing restored"

    skipped = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES, conflict_policy=SKIP)))
    assert skipped.files.conflicts == (("a.txt", "skipped"),)
    assert skipped.files.files_changed == _abs(s, "b.txt", "c.txt")
    assert _files(s) == ("a person's\n", None, None)

    (s.cwd / "a.txt").write_text("a person's again\n")
    overwritten = await within(
        s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES, conflict_policy=OVERWRITE))
    )
    assert overwritten.files.conflicts == (("a.txt", "overwritten"),)
    assert _files(s) == ("v0\n", None, None)


async def test_a_conversation_rewind_asks_nothing_of_the_snapshots(make_setup: MakeSetup) -> None:
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    ids = await _three_turns(s)
    outcome = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.CONVERSATION)))
    assert outcome.files == FilesHalf()
    assert _files(s) == ("v2\n", "bee\n", "sea\n")
    assert [r.kind for r in await s.ledger.snapshots(s.sid)] == [TURN_START, TURN_END] * 3


async def test_a_point_without_a_complete_snapshot_is_served_by_the_clis_checkpoints(
    make_setup: MakeSetup,
) -> None:
    s = await make_setup(snapshots=True, workspace_snapshots=True, limits=Limits(max_file_bytes=100))
    ids = await _three_turns(s)
    await s.prompt("big", {"big.bin": "x" * 1000})  # over the bound: its end snapshot is incomplete
    preview = await within(s.engine.dry_run(s.worker, s.request(ids[1], Mode.FILES)))
    assert preview.files.can_rewind and preview.files.source == "checkpoint"
    outcome = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    assert outcome.files.source == "checkpoint" and s.knobs.applied == [ids[1]]


async def test_a_point_without_a_complete_snapshot_is_refused_when_checkpointing_is_off(
    make_setup: MakeSetup,
) -> None:
    s = await make_setup(
        snapshots=True, workspace_snapshots=True, checkpointing=False, limits=Limits(max_file_bytes=100)
    )
    ids = await _three_turns(s)
    await s.prompt("big", {"big.bin": "x" * 1000})
    preview = await within(s.engine.dry_run(s.worker, s.request(ids[1], Mode.FILES)))
    assert preview.files.requested and not preview.files.can_rewind and preview.files.source == "snapshot"
    assert preview.files.refusal is not None and preview.files.refusal.reason == "SNAPSHOT_UNAVAILABLE"
    with pytest.raises(AgentRewindError) as caught:
        await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    assert caught.value.reason == "SNAPSHOT_UNAVAILABLE"
    assert _files(s) == ("v2\n", "bee\n", "sea\n")


async def test_a_point_from_before_the_snapshots_is_served_by_the_clis_checkpoints(
    make_setup: MakeSetup,
) -> None:
    """A prompt whose turn took no snapshot (the session ran before the server kept them)."""
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    early = s.turn("early")
    await _three_turns(s)
    outcome = await within(s.engine.rewind(s.worker, s.request(early, Mode.FILES)))
    assert outcome.files.source == "checkpoint" and s.knobs.applied == [early]
    kinds = [r.kind for r in await s.ledger.snapshots(s.sid)]
    assert REWIND_BEFORE not in kinds, "the CLI restored: no interval of the service's"


async def test_a_session_with_snapshots_on_a_server_without_them_is_served_by_the_clis_checkpoints(
    make_setup: MakeSetup,
) -> None:
    s = await make_setup(snapshots=False, workspace_snapshots=True)
    ids = [await s.prompt(text, edits) for text, edits in (("zero", P0), ("one", P1))]
    outcome = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    assert outcome.files.source == "checkpoint" and s.knobs.applied == [ids[1]]


async def test_a_snapshot_rewind_is_counted_with_its_source(make_setup: MakeSetup) -> None:
    labels = {"mode": "files", "outcome": "applied", "source": "snapshot"}
    before = REGISTRY.get_sample_value("agent_rewind_rewinds_total", labels) or 0.0
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    ids = await _three_turns(s)
    await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    assert (REGISTRY.get_sample_value("agent_rewind_rewinds_total", labels) or 0.0) - before == 1


# Restores that fail


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file write in the workspace fails (removals still work)."""

    def full(self: files.Workspace, path: str, mode: str, chunks: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.Workspace, "write", full)


async def test_a_restore_that_fails_and_is_rolled_back_abandons_the_rewind(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone writes a.txt between the plan and the restore: nothing is changed, nothing is
    recorded, and a retry plans anew."""
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    ids = await _three_turns(s)
    begin = s.ledger.begin_rewind

    async def begin_then_edit(*args: Any, **kwargs: Any) -> None:
        await begin(*args, **kwargs)
        (s.cwd / "a.txt").write_text("written meanwhile\n")

    monkeypatch.setattr(s.ledger, "begin_rewind", begin_then_edit)
    with pytest.raises(FilesUnavailable) as caught:
        await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.BOTH)))
    assert "nothing was changed" in caught.value.message
    assert _files(s) == ("written meanwhile\n", "bee\n", "sea\n")
    assert await s.ledger.rewinds(s.sid) == [] and await s.pending() == []
    assert await s.texts() == ["zero", "one", "two"]


async def test_a_restore_that_fails_and_cannot_be_rolled_back_is_finished_before_anything_else(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    ids = await _three_turns(s)
    _disk_full(monkeypatch)
    with pytest.raises(FilesUnavailable) as caught:
        await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.BOTH)))
    assert "partly restored" in caught.value.message
    [pending] = await s.pending()
    assert not pending.files_applied
    assert await s.texts() == ["zero", "one", "two"], "the cut waits for the files"

    monkeypatch.undo()  # the disk has room again
    await s.resolve()
    assert await s.pending() == []
    assert _files(s) == ("v0\n", None, None)
    assert await s.texts() == ["zero"]


async def test_a_snapshot_rewind_left_pending_waits_for_a_server_with_snapshots(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restarted without snapshots, the server cannot finish it: recovery says so and keeps it;
    restarted with them, it is finished."""
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    ids = await _three_turns(s)
    _disk_full(monkeypatch)
    with pytest.raises(FilesUnavailable):
        await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    monkeypatch.undo()

    await s.restart(snapshots=False)
    await within(s.engine.recover({s.sid: s.worker}))
    assert len(await s.pending()) == 1
    with pytest.raises(StorageUnavailable) as caught:
        await s.resolve()
    assert "snapshots are off" in caught.value.message
    assert _files(s) == ("v2\n", None, None), "as the failed restore left them"

    await s.restart(snapshots=True)
    await within(s.engine.recover({s.sid: s.worker}))
    assert await s.pending() == []
    assert _files(s) == ("v0\n", None, None)
