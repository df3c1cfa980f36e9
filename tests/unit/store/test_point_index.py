"""The points index (`PointIndex`), against every ledger implementation (`ledger` in conftest.py):
a session's visible rewind points, replaced from a row on, written alone or in a rewind's commit,
and gone with DeleteSession's erasure."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from agent_rewind.store.ledger import (
    Anchor,
    Ledger,
    NewEvent,
    NewRewind,
    NewSession,
    PointRow,
    PointsHead,
    PointsUpdate,
)
from agent_rewind.store.postgres import PostgresLedger
from agent_rewind.store.sqlite import SqliteLedger

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
OTHER = "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80"
# What a transcript may hold that a database column may not: NUL (PostgreSQL's text refuses
# it), a lone surrogate (no UTF-8 has it), quotes and backslashes, beyond the BMP.
AWKWARD = 'nul \x00 lone \ud800 "quoted" back\\slash 😀'


def _row(idx: int, *, text: str = "", position: int | None = None) -> PointRow:
    return PointRow(
        idx=idx,
        uuid=f"uuid-{idx}",
        message_id=f"id-{idx}",
        resume_at_message_id=f"parent-{idx}" if idx else "",
        anchor=f"anchor-{idx}" if idx else "",
        text=text or f"prompt {idx}",
        create_time=datetime(2026, 12, 1, 10, 0, idx % 60, 123456, tzinfo=UTC),
        snapshot_pos=position,
        compactions=0,
        copy=False,
    )


def _head(count: int, **kw: object) -> PointsHead:
    values: dict[str, object] = {
        "session_id": SID,
        "covered": 100 * count,
        "digest": "d" * 64,
        "leaf": f"leaf-{count}",
        "seed": {"uuid": f"leaf-{count}", "prompts": count},
        "count": count,
        "last_message_id": f"msg-{count}",
        "snapshot_count": count,
        "leaf_compactions": 0,
        "holds_newest": False,
        "cut": "",
    }
    values.update(kw)
    return PointsHead(**values)  # type: ignore[arg-type]


async def _session(ledger: Ledger, sid: str = SID) -> None:
    await ledger.add_session(NewSession(sid, f"/ws/{sid[:4]}", {}, checkpointing=True))


async def test_a_session_without_an_index_has_no_head_and_no_page(ledger: Ledger) -> None:
    await _session(ledger)
    assert await ledger.points_head(SID) is None
    assert await ledger.points_page(SID, 0, 10) is None
    assert await ledger.point_uuid(SID, 0) is None


async def test_points_are_kept_as_written_and_read_a_page_at_a_time(ledger: Ledger) -> None:
    await _session(ledger)
    rows = tuple(_row(i, position=i) for i in range(5))
    odd = replace(_row(5, text=AWKWARD), create_time=None, copy=True, compactions=2)
    head = _head(6, last_message_id=AWKWARD, holds_newest=True, cut="anchor-3")
    await ledger.record_points(PointsUpdate(head, keep=0, added=(*rows, odd)))

    assert await ledger.points_head(SID) == head
    found = await ledger.points_page(SID, 2, 3)
    assert found is not None
    assert found == (head, list(rows[2:5]))
    assert await ledger.points_page(SID, 5, 100) == (head, [odd])
    assert await ledger.points_page(SID, 6, 100) == (head, []), "past the end: the head alone"
    assert await ledger.point_uuid(SID, 3) == "uuid-3"


async def test_an_update_replaces_the_rows_from_keep_on_and_places_kept_snapshots(ledger: Ledger) -> None:
    await _session(ledger)
    await ledger.record_points(PointsUpdate(_head(4), keep=0, added=tuple(_row(i) for i in range(4))))
    # A rewind to point 2, then a new turn: rows 2 and 3 go, a new row 2 comes; row 1's
    # snapshot, written lazily, is placed.
    new = replace(_row(2), uuid="uuid-new", message_id="id-new")
    await ledger.record_points(PointsUpdate(_head(3), keep=2, added=(new,), positions=(("uuid-1", 7),)))
    found = await ledger.points_page(SID, 0, 10)
    assert found is not None
    head, rows = found
    assert head == _head(3)
    assert rows == [_row(0), _row(1, position=7), new]


async def test_a_position_for_a_row_beyond_keep_changes_nothing(ledger: Ledger) -> None:
    await _session(ledger)
    await ledger.record_points(PointsUpdate(_head(2), keep=0, added=(_row(0), _row(1))))
    await ledger.record_points(PointsUpdate(_head(2), keep=1, added=(_row(1),), positions=(("uuid-1", 9),)))
    found = await ledger.points_page(SID, 0, 10)
    assert found is not None and found[1] == [_row(0), _row(1)]


async def test_a_touch_sets_the_sessions_update_time_in_the_same_write(ledger: Ledger) -> None:
    await _session(ledger)
    before = await ledger.session(SID)
    assert before is not None
    stamp = await ledger.record_points(PointsUpdate(_head(1), keep=0, added=(_row(0),)), touch=True)
    assert stamp is not None and stamp >= before.update_time
    after = await ledger.session(SID)
    assert after is not None and after.update_time == stamp
    assert await ledger.record_points(PointsUpdate(_head(1), keep=1)) is None


class _Commits:
    """How each write of `ledger` commits, seen inside its transaction just before COMMIT:
    SQLite's (synchronous, wal_autocheckpoint) of the writer connection; PostgreSQL's
    synchronous_commit."""

    def __init__(self, ledger: Ledger) -> None:
        self.seen: list[tuple[object, ...]] = []
        if isinstance(ledger, SqliteLedger):
            self._sqlite(ledger)
        else:
            assert isinstance(ledger, PostgresLedger)
            self._postgres(ledger)

    def _sqlite(self, ledger: SqliteLedger) -> None:
        writer, seen = ledger.dialect._writer, self.seen

        class Spy:
            def execute(self, statement: str, *args: Any) -> sqlite3.Cursor:
                if statement == "COMMIT":
                    sync = writer.execute("PRAGMA synchronous").fetchone()[0]
                    checkpoint = writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
                    seen.append((sync, checkpoint))
                return writer.execute(statement, *args)

            def __getattr__(self, name: str) -> Any:
                return getattr(writer, name)

        ledger.dialect._writer = Spy()  # type: ignore[assignment]

    def _postgres(self, ledger: PostgresLedger) -> None:
        write, seen = ledger.dialect._write, self.seen

        async def spied(work: Any) -> Any:
            async def body(conn: Any) -> Any:
                result = await work(conn)
                row = await (
                    await conn.execute("SELECT current_setting('synchronous_commit') AS s")
                ).fetchone()
                seen.append((row["s"],))
                return result

            return await write(body)

        ledger.dialect._write = spied  # type: ignore[method-assign]


async def test_an_index_write_that_need_not_be_durable_is_not_fsynced_where_only_the_process_could_lose_it(
    ledger: Ledger,
) -> None:
    """A read's catch-up (`durable=False`): SQLite commits it with no fsync and no checkpoint, then
    puts both back for every other write; PostgreSQL commits it as every write (its server could
    lose it while the replica that wrote it lives on)."""
    await _session(ledger)
    commits = _Commits(ledger)
    await ledger.record_points(PointsUpdate(_head(1), keep=0, added=(_row(0),)), durable=False)
    await ledger.record_points(PointsUpdate(_head(2), keep=1, added=(_row(1),)), touch=True)
    await ledger.record_points(PointsUpdate(_head(3), keep=2, added=(_row(2),)))
    if isinstance(ledger, SqliteLedger):
        off, full = (0, 0), (2, 1000)  # synchronous OFF / FULL, wal_autocheckpoint
        assert commits.seen == [off, full, full]
    else:
        assert commits.seen == [("on",)] * 3
    found = await ledger.points_page(SID, 0, 10)
    assert found == (_head(3), [_row(0), _row(1), _row(2)])


async def test_sessions_have_indexes_of_their_own(ledger: Ledger) -> None:
    await _session(ledger)
    await _session(ledger, OTHER)
    await ledger.record_points(PointsUpdate(_head(2), keep=0, added=(_row(0), _row(1))))
    other = replace(_head(1), session_id=OTHER)
    await ledger.record_points(PointsUpdate(other, keep=0, added=(_row(0, text="theirs"),)))
    assert await ledger.points_page(OTHER, 0, 10) == (other, [_row(0, text="theirs")])
    assert await ledger.points_page(SID, 0, 10) == (_head(2), [_row(0), _row(1)])


async def _pending_rewind(ledger: Ledger, rewind_id: str = "r1") -> None:
    await ledger.begin_rewind(
        NewRewind(rewind_id=rewind_id, session_id=SID, message_id="id-2", mode="conversation", plan={})
    )


async def test_a_rewinds_commit_writes_its_cut_and_the_index_together(ledger: Ledger) -> None:
    await _session(ledger)
    await ledger.record_points(PointsUpdate(_head(4), keep=0, added=tuple(_row(i) for i in range(4))))
    await _pending_rewind(ledger)
    anchor = Anchor(SID, "anchor-2", "id-2", 400, None, "r1")
    cut = _head(2, cut="anchor-2")
    await ledger.complete_rewind("r1", {}, anchor, NewEvent("REWOUND", SID, "r1"), PointsUpdate(cut, keep=2))
    assert await ledger.anchor(SID) == anchor
    assert await ledger.points_page(SID, 0, 10) == (cut, [_row(0), _row(1)])


async def test_a_rewinds_commit_that_fails_leaves_the_index_as_it_was(ledger: Ledger) -> None:
    await _session(ledger)
    await ledger.record_points(PointsUpdate(_head(4), keep=0, added=tuple(_row(i) for i in range(4))))
    with pytest.raises(LookupError):  # no such pending rewind: the transaction rolls back
        await ledger.complete_rewind(
            "missing", {}, None, NewEvent("REWOUND", SID, "missing"), PointsUpdate(_head(2), keep=2)
        )
    assert await ledger.points_page(SID, 0, 10) == (_head(4), [_row(i) for i in range(4)])


async def test_an_erasure_deletes_the_index_and_a_late_write_brings_nothing_back(ledger: Ledger) -> None:
    await _session(ledger)
    await _session(ledger, OTHER)
    await ledger.record_points(PointsUpdate(_head(2), keep=0, added=(_row(0, text="secret"), _row(1))))
    other = replace(_head(1), session_id=OTHER)
    await ledger.record_points(PointsUpdate(other, keep=0, added=(_row(0),)))
    await ledger.erase_session(SID, NewEvent("SESSION_DELETED", SID))
    assert await ledger.points_head(SID) is None
    assert await ledger.points_page(SID, 0, 10) is None
    # A turn's record that lost the race with the erasure writes nothing.
    await ledger.record_points(PointsUpdate(_head(3), keep=0, added=(_row(0, text="secret"),)))
    assert await ledger.points_page(SID, 0, 10) is None
    assert await ledger.points_page(OTHER, 0, 10) == (other, [_row(0)]), "another session's stays"
