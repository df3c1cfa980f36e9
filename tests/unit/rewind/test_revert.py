"""Planning a revert of one turn (rewind/revert.py) from a session's snapshot records, on a real
snapshot store: which snapshots bound the turn, what it refuses, what a dry run carries."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent_rewind.errors import RevertConflict, SnapshotUnavailable
from agent_rewind.rewind.revert import revert_for
from agent_rewind.rewind.workspace import Restore
from agent_rewind.snapshots import Snapshot, SnapshotStore
from agent_rewind.snapshots.taking import REWIND_AFTER, REWIND_BEFORE, TURN_END, TURN_START
from agent_rewind.store.ledger import SnapshotRecord


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def store(tmp_path: Path, workspace: Path) -> Iterator[SnapshotStore]:
    found = SnapshotStore(tmp_path / "state" / "s1.git", workspace)
    yield found
    found.close()


class Records:
    """Snapshot records as the ledger keeps them, each taken of the workspace now."""

    def __init__(self, store: SnapshotStore, workspace: Path) -> None:
        self.store, self.workspace = store, workspace
        self.records: list[SnapshotRecord] = []

    def take(self, kind: str, ref: str, **files: str) -> SnapshotRecord:
        for name, text in files.items():
            (self.workspace / name).write_text(text)
        snapshot = self.store.take()
        record = SnapshotRecord(
            len(self.records) + 1, "s1", kind, ref, snapshot.tree, snapshot.complete, "", datetime.now(UTC)
        )
        self.records.append(record)
        return record

    def now(self) -> Snapshot:
        return self.store.take()


@pytest.fixture
def records(store: SnapshotStore, workspace: Path) -> Records:
    return Records(store, workspace)


def _revert(records: Records, policy: str = "refuse", *, include_diff: bool = False) -> Restore:
    return revert_for(
        records.store,
        "p2",
        records.records[1:],
        records.now(),
        policy,
        include_diff=include_diff,
        chosen=(),
    )


def test_the_turn_is_bounded_by_its_own_end_not_a_later_turn_s(records: Records) -> None:
    records.take(TURN_START, "p1", **{"a.txt": "one\n"})
    records.take(TURN_START, "p2")  # its end was never recorded (the server died mid-turn) ...
    records.take(REWIND_BEFORE, "r1", **{"a.txt": "two\n"})
    records.take(REWIND_AFTER, "r1")
    records.take(TURN_START, "p3")
    records.take(TURN_END, "p3", **{"a.txt": "three\n"})  # ... and a later turn's end is not its
    with pytest.raises(SnapshotUnavailable, match="no snapshot of its end"):
        _revert(records)


def test_a_revert_reads_the_first_end_of_its_turn(records: Records) -> None:
    records.take(TURN_START, "p1", **{"a.txt": "one\n"})
    records.take(TURN_START, "p2")
    records.take(TURN_END, "p2", **{"a.txt": "two\n", "b.txt": "b\n"})
    records.take(TURN_START, "p3")
    records.take(TURN_END, "p3", **{"b.txt": "b, later\n"})
    restore = _revert(records)
    assert restore.paths == ("a.txt",)
    assert restore.conflicts == (("b.txt", "refused"),)
    assert isinstance(restore.refusal, RevertConflict)
    assert (restore.diffs, restore.diffs_truncated) == ((), False), "no diff unless asked"
    shown = _revert(records, include_diff=True)
    assert [d["path"] for d in shown.diffs] == ["a.txt"] and not shown.diffs_truncated


def test_an_incomplete_end_of_the_turn_refuses_the_revert(records: Records) -> None:
    records.take(TURN_START, "p1", **{"a.txt": "one\n"})
    records.take(TURN_START, "p2")
    end = records.take(TURN_END, "p2", **{"a.txt": "two\n"})
    records.records[-1] = SnapshotRecord(
        end.seq, "s1", TURN_END, "p2", None, False, "timed out", end.occur_time
    )
    with pytest.raises(SnapshotUnavailable) as caught:
        _revert(records)
    assert caught.value.metadata["snapshot_state"] == "timeout"
