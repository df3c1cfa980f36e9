"""Retention (storage/retention.py): which points it prunes and where its mark lies, which of the
CLI's backups only pruned points need, and passes over a real ledger, a real snapshot store and a
transcript written as the CLI writes it, cut short at each step and finished by the next pass."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent_rewind import faults
from agent_rewind.rewind.intent import undo_trees
from agent_rewind.snapshots import Limits
from agent_rewind.snapshots.taking import REWIND_BEFORE, TURN_END, TURN_START, Snapshots, repository
from agent_rewind.storage import retention
from agent_rewind.storage.retention import (
    UNDER_WAY,
    Retention,
    SessionRetention,
    cutoff,
    delete_backups,
    is_pruned,
    snapshots_kept_from,
    unneeded_backups,
)
from agent_rewind.store.ledger import NewEvent, NewRewind, NewSession, SessionRecord, SnapshotRecord
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.transcript.entries import RewindPoint
from agent_rewind.transcript.index import Reading, TranscriptIndex

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


# A time after every turn of the tests' transcripts.
LATER = _at(60)


def _stamp(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _points(times: list[datetime | None]) -> list[RewindPoint]:
    return [
        RewindPoint(str(uuid.uuid4()), "", f"p{i}", i, when, has_checkpoint=True)
        for i, when in enumerate(times)
    ]


# The policy


def test_the_newest_points_are_kept_and_the_mark_is_the_oldest_kept_ones_time() -> None:
    points = _points([_at(i) for i in range(5)])
    assert cutoff(points, Retention(points=2), _at(60)) == _at(3)
    assert cutoff(points, Retention(points=5), _at(60)) is None, "as many as it keeps: none pruned"
    assert cutoff(points, Retention(points=9), _at(60)) is None
    assert cutoff(points, Retention(), _at(60)) is None, "off"
    assert cutoff([], Retention(points=2, days=1), _at(60)) is None


def test_points_older_than_the_age_bound_are_pruned() -> None:
    points = _points([_at(i * 60) for i in range(5)])  # an hour apart
    day = 1 / 24
    # At 4:30 a bound of 2 hours keeps the points sent at 3:00 and 4:00.
    assert cutoff(points, Retention(days=2 * day), _at(270)) == _at(180)
    assert cutoff(points, Retention(days=10), _at(270)) is None, "all younger"
    # Older than the bound, all of them: the bound itself is the mark.
    assert cutoff(points, Retention(days=day / 2), _at(600)) == _at(600) - timedelta(days=day / 2)


def test_a_point_either_bound_leaves_out_is_pruned() -> None:
    points = _points([_at(i * 60) for i in range(5)])
    day = 1 / 24
    assert cutoff(points, Retention(points=3, days=10 * day), _at(270)) == _at(120), "the count says more"
    assert cutoff(points, Retention(points=4, days=2 * day), _at(270)) == _at(180), "the age says more"


def test_the_mark_prunes_only_points_sent_before_it() -> None:
    assert is_pruned(_at(1), _at(2))
    assert not is_pruned(_at(2), _at(2)), "the oldest kept point is the mark: kept"
    assert not is_pruned(_at(3), _at(2))
    assert not is_pruned(None, _at(2)), "a point of unknown time is never pruned"
    assert not is_pruned(_at(1), None), "no mark: none is"


def test_without_the_oldest_kept_points_time_nothing_is_pruned() -> None:
    points = _points([_at(0), None, _at(2)])
    assert cutoff(points, Retention(points=2), _at(60)) is None


# A transcript as the CLI writes it: a prompt, its checkpoint (`file-history-snapshot`) and the
# files it first tracks during the turn (`file-history-delta`), and a reply.


@dataclass
class Transcript:
    path: Path
    parent: str | None = None
    prompts: list[str] = field(default_factory=list)

    def _write(self, *entries: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            for entry in entries:
                f.write(json.dumps(entry) + "\n")

    def turn(
        self,
        when: datetime,
        tracked: dict[str, tuple[str | None, int, datetime]],
        first: dict[str, str | None],
    ) -> str:
        """A turn sent at `when`: its checkpoint tracks `tracked` (path -> backup name, version,
        time), and the files it first changes had `first` (path -> v1 backup name)."""
        prompt, reply = str(uuid.uuid4()), str(uuid.uuid4())
        backups = {
            path: {"backupFileName": name, "version": version, "backupTime": _stamp(taken)}
            for path, (name, version, taken) in tracked.items()
        }
        self._write(
            {
                "type": "user",
                "uuid": prompt,
                "parentUuid": self.parent,
                "isSidechain": False,
                "promptSource": "sdk",
                "message": {"role": "user", "content": f"turn {len(self.prompts)}"},
                "timestamp": _stamp(when),
            },
            {
                "type": "file-history-snapshot",
                "messageId": prompt,
                "snapshot": {"messageId": prompt, "trackedFileBackups": backups, "timestamp": _stamp(when)},
                "isSnapshotUpdate": False,
            },
            *(
                {
                    "type": "file-history-delta",
                    "messageId": str(uuid.uuid4()),
                    "snapshotMessageId": prompt,
                    "trackingPath": path,
                    "backup": {
                        "backupFileName": name,
                        "version": 1,
                        "backupTime": _stamp(when + timedelta(seconds=1)),
                    },
                }
                for path, name in first.items()
            ),
            {
                "type": "assistant",
                "uuid": reply,
                "parentUuid": prompt,
                "isSidechain": False,
                "message": {
                    "id": f"msg_{reply[:8]}",
                    "role": "assistant",
                    "content": [{"type": "text", "text": "ok"}],
                },
                "timestamp": _stamp(when + timedelta(seconds=2)),
            },
        )
        self.parent = reply
        self.prompts.append(prompt)
        return prompt

    def reading(self) -> Reading:
        index = TranscriptIndex(self.path)
        index.refresh()
        return Reading(index.view(), index)


def _five_turns(transcript: Transcript) -> None:
    """a.txt is created in the first turn and rewritten in every later one; b.txt existed, and is
    changed in the first and third turns only."""
    a, b = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"
    transcript.turn(_at(0), {}, {"a.txt": None, "b.txt": f"{b}@v1"})
    transcript.turn(_at(1), {"a.txt": (f"{a}@v2", 2, _at(1)), "b.txt": (f"{b}@v2", 2, _at(1))}, {})
    transcript.turn(_at(2), {"a.txt": (f"{a}@v3", 3, _at(2)), "b.txt": (f"{b}@v2", 2, _at(1))}, {})
    transcript.turn(_at(3), {"a.txt": (f"{a}@v4", 4, _at(3)), "b.txt": (f"{b}@v3", 3, _at(3))}, {})
    transcript.turn(_at(4), {"a.txt": (f"{a}@v5", 5, _at(4)), "b.txt": (f"{b}@v3", 3, _at(3))}, {})


@pytest.fixture
def transcript(tmp_path: Path) -> Transcript:
    return Transcript(tmp_path / "transcript.jsonl")


def test_backups_only_pruned_points_need_are_selected_never_a_kept_points_nor_the_newest(
    transcript: Transcript,
) -> None:
    _five_turns(transcript)
    reading = transcript.reading()
    view, index = reading.view, reading.index

    def sent(prompt: str) -> datetime | None:
        entry = index.get(prompt)
        return entry.create_time if entry is not None else None

    before = _at(3)  # the fourth and fifth points kept
    unneeded = unneeded_backups(view.backups, sent, before)
    assert unneeded == {"aaaaaaaaaaaaaaaa@v2", "aaaaaaaaaaaaaaaa@v3", "bbbbbbbbbbbbbbbb@v2"}
    # What a files rewind to a kept point restores (the service's and the CLI's own restore).
    for point in view.points[3:]:
        assert not unneeded & {n for n in view.checkpoint_files(point).values() if n}
    # Only the first point pruned: b.txt's second version is the third point's too.
    assert unneeded_backups(view.backups, sent, _at(1)) == set()
    assert unneeded_backups(view.backups, sent, _at(2)) == {"aaaaaaaaaaaaaaaa@v2"}
    # Everything pruned but the newest versions and b.txt's first.
    assert unneeded_backups(view.backups, sent, _at(10)) == {
        "aaaaaaaaaaaaaaaa@v2",
        "aaaaaaaaaaaaaaaa@v3",
        "aaaaaaaaaaaaaaaa@v4",
        "bbbbbbbbbbbbbbbb@v2",
    }


def test_a_backup_of_a_prompt_of_unknown_time_or_of_a_name_not_the_clis_is_kept(
    transcript: Transcript,
) -> None:
    transcript.turn(_at(0), {}, {"a.txt": "c@v1"})
    transcript.turn(_at(1), {"a.txt": ("c@v2", 2, _at(1)), "x": ("odd-name", 2, _at(1))}, {})
    transcript.turn(_at(2), {"a.txt": ("c@v3", 3, _at(2))}, {})
    view = transcript.reading().view
    assert unneeded_backups(view.backups, lambda prompt: None, _at(9)) == set()
    index = transcript.reading().index

    def sent(prompt: str) -> datetime | None:
        entry = index.get(prompt)
        return entry.create_time if entry is not None else None

    assert unneeded_backups(view.backups, sent, _at(9)) == {"c@v2"}


def test_backups_are_deleted_by_name_never_through_a_link(tmp_path: Path) -> None:
    history = tmp_path / "file-history" / "s"
    history.mkdir(parents=True)
    for name in ("x@v2", "x@v3", "y@v2"):
        (history / name).write_text(name)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x@v2").write_text("not a backup")
    assert delete_backups(history, {"x@v2", "gone@v2"}) == 1
    assert sorted(os.listdir(history)) == ["x@v3", "y@v2"]
    link = tmp_path / "file-history" / "linked"
    link.symlink_to(elsewhere)
    with pytest.raises(OSError):
        delete_backups(link, {"x@v2"})
    assert (elsewhere / "x@v2").exists()
    assert delete_backups(tmp_path / "none", {"x@v2"}) == 0


def test_snapshots_are_kept_from_the_oldest_kept_prompts_turn_start() -> None:
    def rec(seq: int, kind: str, ref: str) -> SnapshotRecord:
        return SnapshotRecord(seq, "s", kind, ref, "t", True, "", T0)

    records = [
        rec(1, TURN_START, "p1"),
        rec(2, TURN_END, "p1"),
        rec(3, TURN_START, "cmd"),  # a turn whose prompt never reached the transcript
        rec(4, REWIND_BEFORE, "r"),
        rec(5, TURN_START, "p2"),
        rec(6, TURN_END, "p2"),
    ]
    assert snapshots_kept_from(records, lambda p: p == "p2") == 5
    assert snapshots_kept_from(records, lambda p: p in ("p1", "p2")) == 1
    assert snapshots_kept_from(records, lambda p: False) == 7, "none kept: all pruned"
    assert snapshots_kept_from([], lambda p: True) == 0


# Passes, against a real ledger and snapshot store


@dataclass
class World:
    ledger: SqliteLedger
    snapshots: Snapshots
    session: Any
    workspace: Path
    transcript: Transcript

    def retention(self, rule: Retention, at: datetime = LATER) -> SessionRetention:
        return SessionRetention(
            self.session,
            self.ledger,
            self.snapshots,
            rule,
            structlog.get_logger(),
            undo_trees,
            clock=lambda: at,
        )

    @property
    def repo(self) -> Path:
        return repository(self.snapshots.root, self.session.session_id)

    def has(self, tree: str) -> bool:
        done = subprocess.run(
            ["git", "--git-dir", str(self.repo), "cat-file", "-e", tree], capture_output=True
        )
        return done.returncode == 0

    def backups(self) -> list[str]:
        return sorted(os.listdir(self.session.file_history))


class _Fake:
    """A session for passes: the `Retained` calls, over a transcript file."""

    def __init__(self, record: SessionRecord, history: Path, transcript: Transcript) -> None:
        self.record = record
        self.session_id = record.session_id
        self.file_history = history
        self._transcript = transcript
        self.lock = asyncio.Lock()
        self.gone = False
        self.client_pid: int | None = None
        self.turn_running = False
        self.changed = 0
        self.forgotten = 0

    async def transcript(self) -> Reading:
        return self._transcript.reading()

    def storage_changed(self) -> None:
        self.changed += 1

    def forget(self) -> None:
        self.forgotten += 1


@pytest.fixture
async def world(tmp_path: Path, transcript: Transcript) -> AsyncIterator[World]:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    sid = str(uuid.uuid4())
    record = await ledger.add_session(NewSession(sid, str(workspace), {}, True, workspace_snapshots=True))
    snapshots = Snapshots(tmp_path / "snapshots", ledger, Limits())
    history = tmp_path / "claude" / "file-history" / sid
    history.mkdir(parents=True)
    try:
        yield World(ledger, snapshots, _Fake(record, history, transcript), workspace, transcript)
    finally:
        snapshots.close()
        await ledger.close()


async def _five_snapshotted_turns(w: World) -> list[str | None]:
    """The five turns of `_five_turns`, each snapshotted at its start and end (a.txt holding the
    turn's number), with the backups the transcript names on disk. The trees of each turn's start."""
    _five_turns(w.transcript)
    sid, cwd = w.session.session_id, str(w.workspace)
    (w.workspace / "base.txt").write_text(os.urandom(8).hex())  # the first start's own tree
    for i, prompt in enumerate(w.transcript.prompts):
        await w.snapshots.take_and_record(sid, cwd, TURN_START, prompt)
        (w.workspace / "a.txt").write_text(f"turn {i}: {os.urandom(8).hex()}\n")
        await w.snapshots.take_and_record(sid, cwd, TURN_END, prompt)
    for backup in w.transcript.reading().view.backups:
        if backup.name:
            (w.session.file_history / backup.name).write_text(backup.name)
    return [r.tree for r in await w.snapshots.records(sid) if r.kind == TURN_START]


async def test_a_pass_marks_the_pruned_points_and_deletes_only_what_they_needed(world: World) -> None:
    w = world
    starts = await _five_snapshotted_turns(w)
    done = await w.retention(Retention(points=2)).run()
    assert done is not None and done.before == _at(3) and done.snapshots == 6 and done.collected
    usage = await w.ledger.usage(w.session.session_id)
    assert usage is not None and usage.files_pruned_before == _at(3)
    records = await w.snapshots.records(w.session.session_id)
    assert [r.tree is None for r in records] == [True] * 6 + [False] * 4
    assert w.snapshots.available(records) == {p: i >= 3 for i, p in enumerate(w.transcript.prompts)}
    # The first three turns' starts only pruned snapshots held.
    assert [w.has(t) for t in starts if t] == [False, False, False, True, True]
    assert w.backups() == [
        "aaaaaaaaaaaaaaaa@v4",
        "aaaaaaaaaaaaaaaa@v5",
        "bbbbbbbbbbbbbbbb@v1",
        "bbbbbbbbbbbbbbbb@v3",
    ]
    assert not (w.repo / UNDER_WAY).exists() and w.session.changed == 1
    # Nothing more to do: the next pass deletes nothing and collects nothing.
    again = await w.retention(Retention(points=2)).run()
    assert again == retention.Pruned(_at(3))


async def test_the_mark_only_moves_later(world: World) -> None:
    w = world
    await _five_snapshotted_turns(w)
    await w.retention(Retention(points=2)).run()
    # Fewer kept now (a conversation rewind made fewer points visible, say): the mark stays.
    done = await w.retention(Retention(points=4)).run()
    assert done is not None and done.before == _at(3)
    usage = await w.ledger.usage(w.session.session_id)
    assert usage is not None and usage.files_pruned_before == _at(3)


async def test_a_pass_by_age_alone(world: World) -> None:
    w = world
    await _five_snapshotted_turns(w)
    # At 12:06, a bound of 4 minutes keeps the points of 12:02 on.
    done = await w.retention(Retention(days=4 / (24 * 60)), at=_at(6)).run()
    assert done is not None and done.before == _at(2)
    usage = await w.ledger.usage(w.session.session_id)
    assert usage is not None and usage.files_pruned_before == _at(2)


async def test_the_latest_rewinds_undo_trees_are_kept_while_its_point_is(world: World) -> None:
    w = world
    await _five_snapshotted_turns(w)
    sid = w.session.session_id
    store = w.snapshots.store(sid, str(w.workspace))
    (w.workspace / "only-before.txt").write_text(os.urandom(8).hex())
    before = await w.snapshots.run(lambda: store.capture(["only-before.txt"]))
    (w.workspace / "only-before.txt").write_text(os.urandom(8).hex())
    after = await w.snapshots.run(lambda: store.capture(["only-before.txt"]))
    (w.workspace / "only-before.txt").unlink()
    target = w.transcript.prompts[3]
    await _applied_rewind(w.ledger, sid, target, before, after)
    await w.retention(Retention(points=2)).run()
    assert w.has(before) and w.has(after), "the fourth point is kept: its rewind stays undoable"
    await w.retention(Retention(points=1)).run()
    assert not w.has(before) and not w.has(after), "its point pruned: so is what its undo needed"


async def _applied_rewind(ledger: SqliteLedger, sid: str, target: str, before: str, after: str) -> None:
    """A files rewind to `target` from the CLI's checkpoints, applied, with what its undo needs."""
    from agent_rewind.rewind.intent import Applied, FilesBefore, Intent
    from agent_rewind.rewind.outcome import ConversationHalf, FilesHalf, RewindOutcome

    rewind_id = str(uuid.uuid4())
    outcome = RewindOutcome(rewind_id, FilesHalf(True, True), ConversationHalf(), "")
    intent = Intent(target, True, outcome, None, files_before=FilesBefore(before, ("only-before.txt",)))
    await ledger.begin_rewind(NewRewind(rewind_id, sid, target, "files", intent.to_json()))
    event = NewEvent(kind="REWOUND", session_id=sid, rewind_id=rewind_id)
    await ledger.complete_rewind(rewind_id, Applied(outcome, files_after=after).to_json(), None, event)


class _Crash(BaseException):
    """The server dying at a fault step (SIGKILL), as a pass sees it."""


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    armed: list[str] = []

    def point(step: str) -> None:
        assert step in faults.STEPS
        if armed and armed[0] == step:
            armed.clear()
            raise _Crash(step)

    monkeypatch.setattr(faults, "point", point)
    yield armed


@pytest.mark.parametrize("step", ["retention.marked", "retention.pruned", "retention.collected"])
async def test_a_pass_cut_short_leaves_the_points_marked_and_the_next_pass_at_load_finishes_it(
    world: World, crash_at: list[str], step: str
) -> None:
    w = world
    starts = await _five_snapshotted_turns(w)
    crash_at.append(step)
    with pytest.raises(_Crash):
        await w.retention(Retention(points=2)).run()
    usage = await w.ledger.usage(w.session.session_id)
    assert usage is not None and usage.files_pruned_before == _at(3), "marked before anything is deleted"
    records = await w.snapshots.records(w.session.session_id)
    assert all(r.tree is not None and w.has(r.tree) for r in records[6:]), "what kept points need is there"
    assert {"aaaaaaaaaaaaaaaa@v4", "aaaaaaaaaaaaaaaa@v5", "bbbbbbbbbbbbbbbb@v3"} <= set(w.backups())
    assert (w.repo / UNDER_WAY).exists()
    # The next start: a pass at load, as the marker says one was cut short (no age bound here).
    w.snapshots.forget(w.session.session_id)
    after_restart = w.retention(Retention(points=2))
    after_restart.loaded()
    await after_restart.settled()
    assert [w.has(t) for t in starts if t] == [False, False, False, True, True]
    assert w.backups() == [
        "aaaaaaaaaaaaaaaa@v4",
        "aaaaaaaaaaaaaaaa@v5",
        "bbbbbbbbbbbbbbbb@v1",
        "bbbbbbbbbbbbbbbb@v3",
    ]
    assert not (w.repo / UNDER_WAY).exists()
    assert w.session.forgotten == 1, "the transcript a pass at load read is let go"


async def test_no_pass_at_load_without_an_age_bound_or_a_pass_cut_short(world: World) -> None:
    w = world
    await _five_snapshotted_turns(w)
    at_load = w.retention(Retention(points=2))
    at_load.loaded()
    await at_load.settled()
    assert await w.ledger.usage(w.session.session_id) is None, "nothing read, nothing marked"
    by_age = w.retention(Retention(points=2, days=1 / (24 * 60)), at=_at(5))
    by_age.loaded()
    await by_age.settled()
    usage = await w.ledger.usage(w.session.session_id)
    assert usage is not None and usage.files_pruned_before == _at(4)


async def test_a_pass_waits_for_the_sessions_lock_and_skips_a_deleted_session(world: World) -> None:
    w = world
    await _five_snapshotted_turns(w)
    rule = w.retention(Retention(points=2))
    async with w.session.lock:  # a turn or a rewind holds the session
        rule.soon()
        await asyncio.sleep(0.05)
        assert await w.ledger.usage(w.session.session_id) is None, "nothing while it is held"
        w.session.gone = True
    await rule.settled()
    assert await w.ledger.usage(w.session.session_id) is None


async def test_a_pass_asked_for_while_the_pass_at_load_waits_is_not_lost(world: World) -> None:
    w = world
    await _five_snapshotted_turns(w)
    rule = w.retention(Retention(points=2))
    async with w.session.lock:
        rule.loaded()  # nothing to do at load (no age bound, no pass cut short)
        rule.soon()  # a turn ended meanwhile
    await rule.settled()
    usage = await w.ledger.usage(w.session.session_id)
    assert usage is not None and usage.files_pruned_before == _at(3)
