"""Each session's visible rewind points (`PointIndex`), over SQL: a head row per session, a row
per point; and `write`, which a rewind's commit runs in its own transaction."""

from __future__ import annotations

import json
from datetime import datetime

from agent_rewind.store.dialect import Row, Spelling, Work
from agent_rewind.store.records import PointRow, PointsHead, PointsUpdate, now
from agent_rewind.store.sql.database import Database

_HEAD_COLUMNS = (
    "covered",
    "digest",
    "leaf",
    "seed",
    "points_count",
    "last_message_id",
    "snapshot_count",
    "leaf_compactions",
    "holds_newest",
    "cut",
)
_POINT_COLUMNS = (
    "idx",
    "uuid",
    "message_id",
    "resume_at_message_id",
    "anchor",
    "preview",
    "create_time",
    "snapshot_pos",
    "compactions",
    "is_copy",
)


def _text(value: str) -> str:
    """A string as the points index stores it: its JSON escape, which both databases take
    whatever it holds (PostgreSQL refuses NUL in text; a lone surrogate is no UTF-8). The same
    string for printable ASCII without quotes or backslashes (an id); `_untext` gives the
    original back."""
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return value
    return json.dumps(value)[1:-1]


def _untext(value: str) -> str:
    if "\\" not in value:  # nothing was escaped (an escape always holds a backslash)
        return value
    decoded: str = json.loads(f'"{value}"')
    return decoded


class _Sql:
    """The points index's statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, s: Spelling) -> None:
        p = s.p
        heads, points = ", ".join(_HEAD_COLUMNS), ", ".join(_POINT_COLUMNS)
        self.touch = f"UPDATE sessions SET update_time = {p} WHERE session_id = {p}"
        # Only a session that is not deleted has an index: an erasure that won the race leaves
        # nothing behind for a write to bring back.
        self.live = f"SELECT 1 FROM sessions WHERE session_id = {p} AND deleted_time IS NULL{s.lock}"
        self.write_head = (
            f"INSERT INTO point_heads (session_id, {heads}) VALUES ({s.marks(1 + len(_HEAD_COLUMNS))})"
            " ON CONFLICT (session_id) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in _HEAD_COLUMNS)
        )
        self.cut = f"DELETE FROM points WHERE session_id = {p} AND idx >= {p}"
        self.position = (
            f"UPDATE points SET snapshot_pos = {p} WHERE session_id = {p} AND uuid = {p} AND idx < {p}"
        )
        self.add = f"INSERT INTO points (session_id, {points}) VALUES ({s.marks(1 + len(_POINT_COLUMNS))})"
        self.head = f"SELECT session_id, {heads} FROM point_heads WHERE session_id = {p}"
        # One statement: the head and its rows from one snapshot of the database.
        self.page = (
            f"SELECT h.session_id, {', '.join(f'h.{c}' for c in _HEAD_COLUMNS)},"
            f" {', '.join(f'p.{c}' for c in _POINT_COLUMNS)} FROM point_heads h"
            f" LEFT JOIN points p ON p.session_id = h.session_id AND p.idx >= {p} AND p.idx < {p}"
            f" WHERE h.session_id = {p} ORDER BY p.idx"
        )
        self.uuid = f"SELECT uuid FROM points WHERE session_id = {p} AND idx = {p}"


class SqlPointIndex:
    def __init__(self, db: Database) -> None:
        self._db, self._d = db, db.dialect
        self._sql = _Sql(db.dialect.SPELLING)

    def write(self, update: PointsUpdate) -> Work[None]:
        head = update.head
        sid = head.session_id
        yield (
            self._sql.write_head,
            (
                sid,
                head.covered,
                head.digest,
                _text(head.leaf),
                json.dumps(head.seed),
                head.count,
                _text(head.last_message_id),
                head.snapshot_count,
                head.leaf_compactions,
                head.holds_newest,
                _text(head.cut),
            ),
        )
        yield self._sql.cut, (sid, update.keep)
        for uuid, position in update.positions:
            yield self._sql.position, (position, sid, _text(uuid), update.keep)
        for row in update.added:
            yield (
                self._sql.add,
                (
                    sid,
                    row.idx,
                    _text(row.uuid),
                    _text(row.message_id),
                    _text(row.resume_at_message_id),
                    _text(row.anchor),
                    _text(row.text),
                    self._d.encode_time(row.create_time) if row.create_time is not None else None,
                    row.snapshot_pos,
                    row.compactions,
                    row.copy,
                ),
            )

    async def record_points(
        self, update: PointsUpdate, *, touch: bool = False, durable: bool = True
    ) -> datetime | None:
        stamp = now() if touch else None

        def write() -> Work[datetime | None]:
            if stamp is not None:
                yield self._sql.touch, (self._d.encode_time(stamp), update.head.session_id)
            if (yield self._sql.live, (update.head.session_id,)).one() is None:
                return stamp
            yield from self.write(update)
            return stamp

        return await self._db.transaction(write, durable=durable)

    async def points_head(self, session_id: str) -> PointsHead | None:
        row = await self._db.row(self._sql.head, session_id)
        return self._head(row) if row is not None else None

    async def points_page(
        self, session_id: str, start: int, size: int
    ) -> tuple[PointsHead, list[PointRow]] | None:
        rows = await self._db.rows(self._sql.page, start, start + size, session_id)
        if not rows:
            return None
        return self._head(rows[0]), [self._point(r) for r in rows if r["idx"] is not None]

    async def point_uuid(self, session_id: str, idx: int) -> str | None:
        row = await self._db.row(self._sql.uuid, session_id, idx)
        return _untext(row["uuid"]) if row is not None else None

    def _head(self, row: Row) -> PointsHead:
        return PointsHead(
            session_id=row["session_id"],
            covered=int(row["covered"]),
            digest=row["digest"],
            leaf=_untext(row["leaf"]),
            seed=json.loads(row["seed"]),
            count=int(row["points_count"]),
            last_message_id=_untext(row["last_message_id"]),
            snapshot_count=int(row["snapshot_count"]),
            leaf_compactions=int(row["leaf_compactions"]),
            holds_newest=bool(row["holds_newest"]),
            cut=_untext(row["cut"]),
        )

    def _point(self, row: Row) -> PointRow:
        return PointRow(
            idx=int(row["idx"]),
            uuid=_untext(row["uuid"]),
            message_id=_untext(row["message_id"]),
            resume_at_message_id=_untext(row["resume_at_message_id"]),
            anchor=_untext(row["anchor"]),
            text=_untext(row["preview"]),
            create_time=self._d.decode_time(row["create_time"]) if row["create_time"] is not None else None,
            snapshot_pos=int(row["snapshot_pos"]) if row["snapshot_pos"] is not None else None,
            compactions=int(row["compactions"]),
            copy=bool(row["is_copy"]),
        )
