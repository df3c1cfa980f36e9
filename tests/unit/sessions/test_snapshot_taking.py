"""Workspace snapshots of a session's turns (taken by sessions/running.py through
snapshots/taking.py, read through sessions/worker.py): none on a server without them or for a
session that turned them off, a snapshot at each turn's start and end otherwise, and only the
newest turns' kept under a retention.

The harness (a fake client, a ledger that fails on demand) is in harness.py and conftest.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_rewind.snapshots import Limits
from agent_rewind.snapshots.taking import Snapshots
from agent_rewind.store.ledger import NewSession
from tests.unit.sessions.harness import FlakyLedger, MakeWorker, collect, within

# Workspace snapshots


@pytest.fixture
async def snapshots(tmp_path: Path, ledger: FlakyLedger) -> AsyncIterator[Snapshots]:
    found = Snapshots(tmp_path / "snapshots", ledger, Limits())
    yield found
    found.close()


async def _snapshotted_session(ledger: FlakyLedger, tmp_path: Path, on: bool = True) -> str:
    sid = str(uuid.uuid4())
    cwd = tmp_path / "workspaces" / sid
    cwd.mkdir(parents=True)
    (cwd / "notes.txt").write_text("hello")
    await ledger.add_session(NewSession(sid, str(cwd), {}, True, workspace_snapshots=on))
    return sid


async def test_without_snapshots_on_the_server_a_session_has_none(make_worker: MakeWorker) -> None:
    worker, _ = await make_worker()
    turn = await within(worker.start_turn("hi"))
    await collect(turn)
    assert await worker.snapshot_bytes() == 0
    assert await worker.snapshot_availability([turn.prompt_id]) == {}


async def test_a_turn_of_a_session_with_snapshots_is_snapshotted(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path, snapshots: Snapshots
) -> None:
    sid = await _snapshotted_session(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid, snapshots=snapshots)
    turn = await within(worker.start_turn("hi"))
    await collect(turn)
    assert await worker.snapshot_availability([turn.prompt_id, "another"]) == {turn.prompt_id: True}
    assert await worker.snapshot_bytes() > 0
    assert [r.kind for r in await ledger.snapshots(sid)] == ["turn_start", "turn_end"]


async def test_a_session_with_snapshots_off_is_not_snapshotted_on_a_server_with_them(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path, snapshots: Snapshots
) -> None:
    sid = await _snapshotted_session(ledger, tmp_path, on=False)
    worker, _ = await make_worker(session_id=sid, snapshots=snapshots)
    turn = await within(worker.start_turn("hi"))
    await collect(turn)
    assert await worker.snapshot_availability([turn.prompt_id]) == {}
    assert await ledger.snapshots(sid) == []


async def test_snapshot_retention_keeps_the_newest_turns_snapshots(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path, snapshots: Snapshots
) -> None:
    sid = await _snapshotted_session(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid, snapshots=snapshots, snapshot_retention=1)
    first = await within(worker.start_turn("one"))
    await collect(first)
    second = await within(worker.start_turn("two"))
    await collect(second)
    await within(worker.retention.settled())  # the pass after the turn, in the background
    available = await worker.snapshot_availability([first.prompt_id, second.prompt_id])
    assert available.get(second.prompt_id) is True
    assert available.get(first.prompt_id) is not True
