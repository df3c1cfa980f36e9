"""The SQLite ledger beyond the contract: durability across reopening, and schema migration."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from agent_rewind.store.ledger import Anchor, NewEvent, NewRequest, NewRewind, NewSession
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
        assert ledger.schema_version == len(MIGRATIONS)
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
    assert again.schema_version == len(MIGRATIONS)
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
