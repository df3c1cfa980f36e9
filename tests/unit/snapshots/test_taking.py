"""A session's snapshots taken, recorded in order, judged for availability and kept by retention:
a real git store and a real SQLite ledger."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from agent_rewind.snapshots import Limits, Snapshot, SnapshotStore, taking
from agent_rewind.snapshots.taking import TURN_END, TURN_START, Snapshots
from agent_rewind.store.ledger import NewSession
from agent_rewind.store.sqlite import SqliteLedger

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"


@pytest.fixture
async def snaps(tmp_path: Path) -> AsyncIterator[tuple[Snapshots, Path]]:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    await ledger.add_session(NewSession(SID, str(workspace), {}, checkpointing=True))
    found = Snapshots(tmp_path / "snapshots", ledger, Limits(max_file_bytes=100))
    try:
        yield found, workspace
    finally:
        found.close()
        await ledger.close()


def _has(repo: Path, oid: str) -> bool:
    return (
        subprocess.run(["git", "--git-dir", str(repo), "cat-file", "-e", oid], capture_output=True).returncode
        == 0
    )


async def _turn(snaps: Snapshots, ws: Path, prompt: str, write: dict[str, str]) -> None:
    await snaps.take_and_record(SID, str(ws), TURN_START, prompt)
    for name, text in write.items():
        (ws / name).write_text(text)
    await snaps.take_and_record(SID, str(ws), TURN_END, prompt)


async def test_snapshots_are_recorded_in_order_and_a_later_incomplete_one_makes_earlier_points_unavailable(
    snaps: tuple[Snapshots, Path],
) -> None:
    s, ws = snaps
    await _turn(s, ws, "p1", {"a.txt": "one"})
    await _turn(s, ws, "p2", {"a.txt": "two"})
    assert [(r.kind, r.ref, r.complete) for r in await s.records(SID)] == [
        (TURN_START, "p1", True),
        (TURN_END, "p1", True),
        (TURN_START, "p2", True),
        (TURN_END, "p2", True),
    ]
    assert s.available(await s.records(SID)) == {"p1": True, "p2": True}
    await _turn(s, ws, "p3", {"big.bin": "x" * 1000})  # over the 100-byte bound at its end
    records = await s.records(SID)
    assert not records[-1].complete and "big.bin" in records[-1].reason
    # Every point before the incomplete snapshot would read it: none can be served.
    assert s.available(records) == {"p1": False, "p2": False, "p3": False}
    s.forget(SID)
    assert await s.records(SID) == records, "read back from the ledger as recorded"


async def test_pruned_records_lose_their_trees_and_collecting_deletes_what_only_they_reached(
    snaps: tuple[Snapshots, Path],
) -> None:
    s, ws = snaps
    for i in range(4):
        await _turn(s, ws, f"p{i}", {f"f{i}.txt": f"unique content {i}"})
    first_tree = (await s.records(SID))[1].tree  # p0's end: holds f0.txt only
    assert first_tree is not None
    keep_from = (await s.records(SID))[4].seq  # p2's start
    assert await s.prune_records(SID, keep_from) == 4
    records = await s.records(SID)
    assert s.available(records) == {"p0": False, "p1": False, "p2": True, "p3": True}
    assert [r.reason for r in records[:4]] == ["pruned"] * 4
    repo = s.root / f"{SID}.git"
    assert _has(repo, first_tree), "pruning the records deletes nothing yet"
    await s.collect(SID, str(ws))
    assert not _has(repo, first_tree), "an unreachable tree is collected"
    kept = records[4].tree
    assert kept is not None and _has(repo, kept)
    assert await s.prune_records(SID, keep_from) == 0, "pruned once"


async def test_collecting_keeps_the_trees_it_is_told_to_besides_the_snapshots(
    snaps: tuple[Snapshots, Path],
) -> None:
    s, ws = snaps
    await _turn(s, ws, "p0", {"a.txt": "a"})
    (ws / "b.txt").write_text("only in a captured tree")
    captured = await s.run(lambda: s.store(SID, str(ws)).capture(["b.txt"]))
    (ws / "b.txt").unlink()
    await _turn(s, ws, "p1", {"a.txt": "a2"})
    await s.prune_records(SID, (await s.records(SID))[2].seq)
    await s.collect(SID, str(ws), also_keep=[captured])
    repo = s.root / f"{SID}.git"
    assert _has(repo, captured)
    await s.collect(SID, str(ws))
    assert not _has(repo, captured)


async def _watching(s: Snapshots, where: Path, sessions: list[str], expected: list[bool]) -> None:
    """Waits (2 s at most) for the watches to be as expected: stores stop watching in the
    snapshot threads, after the call that decided it."""
    deadline = asyncio.get_running_loop().time() + 2
    while True:
        found = []
        for sid in sessions:
            watch = s.store(sid, str(where / sid))._watch
            found.append(watch is not None and watch.watching)
        if found == expected or asyncio.get_running_loop().time() > deadline:
            assert found == expected
            return
        await asyncio.sleep(0.01)


async def test_past_the_bound_of_watched_stores_the_least_recently_snapshotted_stops_watching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(taking, "MAX_WATCHED", 2)
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    s = Snapshots(tmp_path / "snapshots", ledger, Limits(), watch=True)
    try:
        sessions = [f"{SID[:-1]}{i}" for i in range(3)]
        for sid in sessions:
            (tmp_path / sid).mkdir()
            assert (await s.take(sid, str(tmp_path / sid))).how == "scan"
        await _watching(s, tmp_path, sessions, [False, True, True])
        # Used again, it scans once more (and watches again), and the next least recent stops.
        (tmp_path / sessions[0] / "f").write_text("x")
        assert (await s.take(sessions[0], str(tmp_path / sessions[0]))).how == "scan"
        await _watching(s, tmp_path, sessions, [True, False, True])
        assert (await s.take(sessions[0], str(tmp_path / sessions[0]))).how == "unchanged"
        s.forget(sessions[2])  # hibernated: it stops watching too
        await _watching(s, tmp_path, sessions, [True, False, False])
    finally:
        s.close()
        await ledger.close()


class _Held:
    """Holds every store's take until released (in the snapshot threads), then runs it; `during`
    runs as the take has read the workspace (the turn would be running: the take is past its
    bound); after `release`, `after_read` (once set) holds the take between its read and its
    end, as a first take copying a big checkout's blobs does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.during: Callable[[], None] = lambda: None
        self.after_read: threading.Event | None = None
        real = SnapshotStore.take
        real_read = SnapshotStore._read

        def take(
            store: SnapshotStore, timeout_s: float | None = None, on_read: Callable[[], None] | None = None
        ) -> Snapshot:
            if self.after_read is None:
                assert self.release.wait(60), "never released"
            return real(store, timeout_s, on_read)

        def read(store: SnapshotStore) -> None:
            reading = store._on_read is not None
            if reading:
                self.during()
            real_read(store)
            if reading and self.after_read is not None:
                assert self.after_read.wait(60), "never let finish"

        monkeypatch.setattr(SnapshotStore, "take", take)
        monkeypatch.setattr(SnapshotStore, "_read", read)


@pytest.fixture
async def slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Snapshots, Path, _Held]]:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("before the turn\n")
    await ledger.add_session(NewSession(SID, str(workspace), {}, checkpointing=True))
    held = _Held(monkeypatch)
    monkeypatch.setattr(taking, "BACKGROUND_TIMES", 2000)  # in the background: 100 s to end
    found = Snapshots(tmp_path / "snapshots", ledger, Limits(timeout_s=0.05), watch=True)
    try:
        yield found, workspace, held
    finally:
        held.release.set()
        await found.settled(SID)
        found.close()
        await ledger.close()


async def test_a_first_snapshot_past_the_bound_is_recorded_when_it_ends(
    slow: tuple[Snapshots, Path, _Held],
) -> None:
    s, ws, held = slow
    # The turn does not wait for it: nothing is recorded yet, the point has no snapshot.
    assert await s.take_and_record(SID, str(ws), TURN_START, "p1") is None
    assert await s.availability(SID) == {}
    held.release.set()
    await s.settled(SID)
    [record] = await s.records(SID)
    assert (record.kind, record.ref, record.complete) == (TURN_START, "p1", True), record.reason
    assert await s.availability(SID) == {"p1": True}
    assert [p for p in s.store(SID, str(ws)).files(record.tree or "")] == ["a.txt"]


async def test_a_first_snapshot_the_workspace_changed_under_is_recorded_incomplete(
    slow: tuple[Snapshots, Path, _Held],
) -> None:
    s, ws, held = slow
    held.during = lambda: (ws / "a.txt").write_text("the agent's first edit\n")
    assert await s.take_and_record(SID, str(ws), TURN_START, "p1") is None
    held.release.set()
    await s.settled(SID)
    [record] = await s.records(SID)
    assert not record.complete and record.reason == taking.CHANGED_MEANWHILE
    assert await s.availability(SID) == {"p1": False}


async def test_a_first_snapshot_read_within_the_bound_lets_the_turn_go_on_and_holds_the_workspace_before_it(
    slow: tuple[Snapshots, Path, _Held],
) -> None:
    s, ws, held = slow
    s.limits = Limits(timeout_s=30.0)  # time to read the workspace, on a loaded machine too
    held.after_read = threading.Event()  # read at once; the rest waits (a big checkout's copy)
    assert await s.take_and_record(SID, str(ws), TURN_START, "p1") is None  # the turn goes on
    assert await s.availability(SID) == {}  # no snapshot until it is complete
    (ws / "a.txt").write_text("the agent's first edit\n")  # while the take finishes
    held.after_read.set()
    await s.settled(SID)
    [record] = await s.records(SID)
    assert record.complete, record.reason  # what it holds was read before the edit
    assert await s.availability(SID) == {"p1": True}
    store = s.store(SID, str(ws))
    end = await s.take_and_record(SID, str(ws), TURN_END, "p1")
    assert end is not None and end.complete
    [change] = store.changes(record.tree or "", end.tree or "")
    assert change.path == "a.txt"


async def test_the_next_snapshot_waits_for_a_first_one_in_the_background(
    slow: tuple[Snapshots, Path, _Held],
) -> None:
    s, ws, held = slow
    assert await s.take_and_record(SID, str(ws), TURN_START, "p1") is None
    end = asyncio.ensure_future(s.take_and_record(SID, str(ws), TURN_END, "p1"))
    await asyncio.sleep(0)
    assert not end.done() and await s.records(SID) == []
    held.release.set()
    assert (await end) is not None
    assert [(r.kind, r.ref) for r in await s.records(SID)] == [(TURN_START, "p1"), (TURN_END, "p1")]
    # A first snapshot within the bound is recorded at once, as any other.
    assert (await s.take_and_record(SID, str(ws), TURN_START, "p2")) is not None
