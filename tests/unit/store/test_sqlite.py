"""The SQLite ledger beyond the contract: durability across reopening, and schema migration."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.errors import StorageUnavailable
from agent_rewind.store import sqlite as sqlite_module
from agent_rewind.store.ledger import (
    Anchor,
    NewEvent,
    NewRequest,
    NewRewind,
    NewSession,
    PointRow,
    PointsHead,
    PointsUpdate,
)
from agent_rewind.store.sqlite import MIGRATIONS, SchemaTooNew, SqliteLedger

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"


async def test_everything_survives_closing_and_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    first = await SqliteLedger.open(path)
    await first.add_session(
        NewSession(SID, "/ws/a", {"model": "m"}, False), NewRequest("req-1", "CreateSession", "fp", SID)
    )
    await first.touch_session(SID, started=True)
    await first.begin_rewind(
        NewRewind("r1", SID, "m-1", "both", {"target": "m-1"}, request=NewRequest("rw-1", "Rewind", "f", SID))
    )
    anchor = Anchor(SID, "a-1", "m-1", 10, None, "r1")
    await first.complete_rewind("r1", {"ok": True}, anchor, NewEvent("REWOUND", SID, "r1"))
    await first.begin_rewind(NewRewind("r2", SID, "m-2", "files", {"target": "m-2"}))
    await first.close()

    second = await SqliteLedger.open(path)
    try:
        record = await second.session(SID)
        assert record is not None and record.options == {"model": "m"} and record.started
        assert await second.anchor(SID) == anchor
        request = await second.request("rw-1")
        assert request is not None and request.done
        applied = await second.rewind("r1")
        assert applied is not None and (applied.state, applied.cursor, applied.result) == (
            "applied",
            1,
            {"ok": True},
        )
        assert [r.rewind_id for r in await second.pending_rewinds()] == ["r2"]
        assert (await second.complete_rewind("r2", {}, None, NewEvent("REWOUND", SID, "r2"))).cursor == 2
    finally:
        await second.close()


async def test_a_write_waits_out_the_busy_timeout_for_another_writer_then_is_unavailable(
    tmp_path: Path,
) -> None:
    """Another writer holding the file's write lock (a backup, an operator's sqlite3 shell) is
    waited for as long as the busy timeout says; then the write is StorageUnavailable and has
    changed nothing. Once the lock is released, writes go through."""
    path = tmp_path / "ledger.sqlite3"
    ledger = await SqliteLedger.open(path, busy_timeout=0.3)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(StorageUnavailable):
            await ledger.begin_request(NewRequest("req-1", "Prompt", "fp", SID))
        assert time.monotonic() - started >= 0.25, "it waited for the lock, not failed at once"
        holder.execute("ROLLBACK")
        assert await ledger.request("req-1") is None
        await ledger.begin_request(NewRequest("req-1", "Prompt", "fp", SID))
        assert await ledger.request("req-1") is not None
    finally:
        holder.close()
        await ledger.close()


async def test_an_unsynced_write_runs_on_the_loop_and_in_a_thread_only_when_another_writer_holds_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that need not be durable (a read's catch-up of the points index) has no fsync to
    wait for: it commits on the event loop. While another writer holds the file's lock it waits
    in a thread, as every write does, the loop free meanwhile; then it goes through."""
    path = tmp_path / "ledger.sqlite3"
    ledger = await SqliteLedger.open(path, busy_timeout=5)
    await ledger.add_session(NewSession(SID, "/ws/a", {}, False))
    threads: list[str] = []
    to_thread = asyncio.to_thread

    async def spy(fn: Any, /, *args: Any) -> Any:
        threads.append(fn.__name__)
        return await to_thread(fn, *args)

    monkeypatch.setattr(sqlite_module.asyncio, "to_thread", spy)

    def update(n: int) -> PointsUpdate:
        rows = tuple(PointRow(i, f"u{i}", f"u{i}", "", "", "p", None, None, 0, False) for i in range(n))
        return PointsUpdate(PointsHead(SID, n, "", f"u{n}", {}, n, f"u{n}", 0, 0, False, ""), 0, rows)

    holder = sqlite3.connect(path, isolation_level=None)
    try:
        await ledger.record_points(update(1), durable=False)
        assert threads == [], "committed on the loop"
        await ledger.record_points(update(2))
        assert threads == ["locked"], "a durable write waits for its fsync in a thread"
        holder.execute("BEGIN IMMEDIATE")
        waiting = asyncio.create_task(ledger.record_points(update(3), durable=False))
        started = time.monotonic()
        await asyncio.sleep(0.2)
        assert time.monotonic() - started < 0.5, "the loop did not wait for the lock"
        assert not waiting.done() and threads == ["locked", "locked"]
        holder.execute("ROLLBACK")
        await waiting
        head = await ledger.points_head(SID)
        assert head is not None and head.count == 3
        assert ledger.dialect._writer.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    finally:
        holder.close()
        await ledger.close()


async def test_a_read_of_a_file_damaged_under_the_ledger_is_unavailable_like_a_write(tmp_path: Path) -> None:
    """A read that fails in the database (here the file, and its write-ahead log, overwritten
    under the open ledger) is StorageUnavailable, as a failed write is and as PostgreSQL's reads
    are: STORAGE_UNAVAILABLE to the caller, never sqlite3's own error (INTERNAL)."""
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    try:
        await ledger.add_session(NewSession(SID, "/ws/a", {}, True))
        files = sorted(tmp_path.iterdir())
        assert files, "the ledger's files are there to damage"
        for file in files:
            file.write_bytes(b"\x55" * file.stat().st_size)
        with pytest.raises(StorageUnavailable) as failed:
            await ledger.sessions()
        assert failed.value.reason == "STORAGE_UNAVAILABLE"
        with pytest.raises(StorageUnavailable):
            await ledger.session(SID)
        with pytest.raises(StorageUnavailable):
            await ledger.begin_request(NewRequest("req-1", "Prompt", "fp", SID))
    finally:
        await ledger.close()


async def test_the_ledger_creates_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "ledger.sqlite3"
    await (await SqliteLedger.open(path)).close()
    assert path.exists()


async def test_a_round_one_ledger_is_migrated_in_place(tmp_path: Path) -> None:
    """A state dir written by the first release: its sessions, rewinds, cursors and request ids
    carry over, and the event log starts from its last cursor."""
    path = tmp_path / "ledger.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0])
    stamp = "2026-11-01T10:00:00+00:00"
    db.execute(
        "INSERT INTO sessions (session_id, cwd, options_json, checkpointing, create_time, update_time,"
        " started, request_id) VALUES (?, '/ws/a', '{}', 1, ?, ?, 1, 'create-1')",
        (SID, stamp, stamp),
    )
    for n, (state, cursor) in enumerate([("applied", 1), ("applied", 2), ("pending", None)]):
        db.execute(
            "INSERT INTO rewinds (cursor, rewind_id, session_id, request_id, fingerprint, message_id, mode,"
            " state, plan_json, result_json, occur_time) VALUES (?, ?, ?, ?, 'fp', 'm', 'both', ?, ?, ?, ?)",
            (
                cursor,
                f"r{n}",
                SID,
                f"req-{n}",
                state,
                json.dumps({"target": "m"}),
                "{}" if cursor else None,
                stamp,
            ),
        )
    db.commit()
    db.close()

    ledger = await SqliteLedger.open(path)
    try:
        assert await ledger.schema_version() == len(MIGRATIONS)
        record = await ledger.session(SID)
        assert record is not None and record.started and record.principal == ""
        created = await ledger.request("create-1")
        assert created is not None and created.method == "CreateSession" and created.session_id == SID
        rewound = await ledger.request("req-1")
        assert rewound is not None and rewound.result == {"rewind_id": "r1"} and rewound.done
        pending = await ledger.request("req-2")
        assert pending is not None and not pending.done
        assert [e.cursor for e in await ledger.events_after(0)] == [1, 2]
        assert await ledger.event_bounds() == (1, 2)
        assert [r.rewind_id for r in await ledger.pending_rewinds()] == ["r2"]
        assert (await ledger.complete_rewind("r2", {}, None, NewEvent("REWOUND", SID, "r2"))).cursor == 3
    finally:
        await ledger.close()


async def test_reopening_a_current_ledger_migrates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    await (await SqliteLedger.open(path)).close()
    again = await SqliteLedger.open(path)
    assert await again.schema_version() == len(MIGRATIONS)
    await again.close()


async def test_a_ledger_from_a_newer_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    await (await SqliteLedger.open(path)).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
    with pytest.raises(SchemaTooNew):
        await SqliteLedger.open(path)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) + 1


# DeleteSession: what is erased does not survive in the database's files.


def _holding(directory: Path, text: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_file() and text.encode() in p.read_bytes())


async def test_an_erased_session_s_text_is_in_none_of_the_database_files(tmp_path: Path) -> None:
    secret = uuid.uuid4().hex
    path = tmp_path / "ledger.sqlite3"
    ledger = await SqliteLedger.open(path)
    other = "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80"
    try:
        await ledger.add_session(
            NewSession(SID, f"/ws/{secret}", {"system_prompt": secret}, True, "alice"),
            NewRequest("create", "CreateSession", json.dumps([secret]), SID),
        )
        await ledger.add_session(NewSession(other, "/ws/other", {"system_prompt": "kept"}, True))
        for n in range(40):  # small rows and rows over several overflow pages
            await ledger.begin_request(NewRequest(f"p{n}", "Prompt", json.dumps([f"{secret} {n}"]), SID))
            await ledger.finish_request(f"p{n}", {"reply": secret * (1 if n % 2 else 500)})
        await ledger.begin_rewind(NewRewind("r1", SID, "m-1", "both", {"target": "m-1", "note": secret}))
        await ledger.complete_rewind(
            "r1",
            {"files": [f"/ws/{secret}/a.txt"]},
            Anchor(SID, "a-1", "m-1", 10, None, "r1"),
            NewEvent("REWOUND", SID, "r1", data={"files": {"files_changed": [f"/ws/{secret}/a.txt"]}}),
        )
        # The points index holds the prompts' text (its own secret, so its erasure is seen).
        prompt = uuid.uuid4().hex
        rows = tuple(
            PointRow(n, f"u{n}", f"u{n}", "", "", f"{prompt} {n}", None, None, 0, False) for n in range(40)
        )
        head = PointsHead(SID, 1, "", "u39", {}, 40, "u39", 0, 0, False, "")
        await ledger.record_points(PointsUpdate(head, keep=0, added=rows))
        assert _holding(tmp_path, secret) and _holding(tmp_path, prompt)
        assert await ledger.session(other) is not None  # the reader has read: it holds nothing up
        await ledger.erase_session(
            SID, NewEvent("SESSION_DELETED", SID, data={"owner": "alice"}), erasure={"cwd": "/ws/gone"}
        )
        assert _holding(tmp_path, secret) == [], "not in the .sqlite3, nor in the -wal, nor in the -shm"
        assert _holding(tmp_path, prompt) == [], "nor the points index's copy of the prompts"
        assert (tmp_path / "ledger.sqlite3-wal").stat().st_size == 0, "the log was truncated"
        await ledger.finish_erasure(SID)
        assert _holding(tmp_path, "/ws/gone") == [], "the workspace path went with the erasure's end"
        record = await ledger.session(other)
        assert record is not None and record.options == {"system_prompt": "kept"}
    finally:
        await ledger.close()
    assert _holding(tmp_path, secret) == []


async def test_both_connections_overwrite_what_they_delete(tmp_path: Path) -> None:
    """SQLite builds differ in their default: the ledger says so itself."""
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    try:
        for connection in (ledger.dialect._writer, ledger.dialect._reader):
            assert connection.execute("PRAGMA secure_delete").fetchone()[0] == 1
    finally:
        await ledger.close()


async def test_a_schema_3_ledger_gains_tombstones_and_keeps_its_sessions(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    db = sqlite3.connect(path)
    for number, script in enumerate(MIGRATIONS[:3], start=1):
        db.executescript(script)
        db.execute(f"PRAGMA user_version={number}")
    stamp = "2026-11-01T10:00:00+00:00"
    db.execute(
        "INSERT INTO sessions (session_id, cwd, options_json, checkpointing, create_time, update_time)"
        " VALUES (?, '/ws/a', '{}', 1, ?, ?)",
        (SID, stamp, stamp),
    )
    db.commit()
    db.close()
    ledger = await SqliteLedger.open(path)
    try:
        assert await ledger.schema_version() == len(MIGRATIONS)
        assert [r.session_id for r in await ledger.sessions()] == [SID]
        assert await ledger.tombstone(SID) is None and await ledger.unfinished_erasures() == []
        await ledger.erase_session(SID, NewEvent("SESSION_DELETED", SID))
        assert await ledger.sessions() == []
    finally:
        await ledger.close()
