"""Rewinds and their intents (`Rewinds`), and the pending conversation cuts they leave (`Cuts`),
over SQL. A rewind's commit is one transaction: its row, its request, its cut, the points index
as the cut leaves it, and its event."""

from __future__ import annotations

from typing import Any

from agent_rewind.store.dialect import Dialect, Row, Work
from agent_rewind.store.records import (
    Anchor,
    EventRecord,
    NewEvent,
    NewRewind,
    PointsUpdate,
    RewindRecord,
    now,
)
from agent_rewind.store.sql.database import Database
from agent_rewind.store.sql.event_log import SqlEventLog
from agent_rewind.store.sql.point_index import SqlPointIndex
from agent_rewind.store.sql.request_ids import SqlRequests


class _Sql:
    """Rewinds' and cuts' statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, d: Dialect) -> None:
        s, p = d.SPELLING, d.SPELLING.p
        columns = (
            "rewind_id",
            "session_id",
            "request_id",
            "message_id",
            "mode",
            "state",
            s.plan,
            "principal",
            "occur_time",
            "kind",
            *d.legacy_columns("rewinds", None),
        )
        self.insert = f"INSERT INTO rewinds ({', '.join(columns)}) VALUES ({s.marks(len(columns))})"
        self.files_applied = f"UPDATE rewinds SET files_applied = true WHERE rewind_id = {p}"
        # The session's row first (erase_session takes it first too).
        self.touch = (
            f"UPDATE sessions SET update_time = {p} WHERE session_id = (SELECT session_id FROM rewinds"
            f" WHERE rewind_id = {p} AND state = 'pending')"
        )
        self.applied = (
            f"UPDATE rewinds SET state = 'applied', {s.result} = {p} WHERE rewind_id = {p}"
            " AND state = 'pending' RETURNING request_id"
        )
        self.cut = (
            "INSERT INTO anchors (session_id, anchor_uuid, target_message_id, transcript_size,"
            f" drops_turn, rewind_id) VALUES ({s.marks(6)}) ON CONFLICT (session_id) DO UPDATE"
            " SET anchor_uuid = excluded.anchor_uuid, target_message_id = excluded.target_message_id,"
            " transcript_size = excluded.transcript_size, drops_turn = excluded.drops_turn,"
            " rewind_id = excluded.rewind_id"
        )
        self.abandon = f"DELETE FROM rewinds WHERE rewind_id = {p} AND state = 'pending' RETURNING request_id"
        self.rewind = f"SELECT * FROM rewinds WHERE rewind_id = {p}"
        self.pending = "SELECT * FROM rewinds WHERE state = 'pending' ORDER BY id"
        self.session_pending = (
            f"SELECT * FROM rewinds WHERE state = 'pending' AND session_id = {p} ORDER BY id"
        )
        self.rewinds = "SELECT * FROM rewinds ORDER BY id"
        self.session_rewinds = f"SELECT * FROM rewinds WHERE session_id = {p} ORDER BY id"
        self.anchor = f"SELECT * FROM anchors WHERE session_id = {p}"
        self.clear_anchor = f"DELETE FROM anchors WHERE session_id = {p} AND anchor_uuid = {p}"


class SqlRewinds:
    def __init__(
        self, db: Database, requests: SqlRequests, points: SqlPointIndex, events: SqlEventLog
    ) -> None:
        self._db, self._d = db, db.dialect
        self._requests, self._points, self._events = requests, points, events
        self._sql = _Sql(db.dialect)

    async def begin_rewind(self, new: NewRewind) -> None:
        stamp = now()
        d = self._d
        args = (
            new.rewind_id,
            new.session_id,
            new.request.request_id if new.request else None,
            new.message_id,
            new.mode,
            "pending",
            d.encode_json(new.plan),
            new.principal,
            d.encode_time(stamp),
            new.kind,
            *d.legacy_columns("rewinds", new.request).values(),
        )

        def insert() -> Work[None]:
            if new.request is not None:
                yield from self._requests.insert(new.request, stamp, result={"rewind_id": new.rewind_id})
            yield self._sql.insert, args

        await self._db.transaction(insert)

    async def mark_files_applied(self, rewind_id: str) -> None:
        await self._db.execute(self._sql.files_applied, rewind_id)

    async def complete_rewind(
        self,
        rewind_id: str,
        result: dict[str, Any],
        anchor: Anchor | None,
        event: NewEvent,
        points: PointsUpdate | None = None,
    ) -> EventRecord:
        stamp = now()

        def complete() -> Work[EventRecord]:
            yield self._sql.touch, (self._d.encode_time(stamp), rewind_id)
            row = (yield self._sql.applied, (self._d.encode_json(result), rewind_id)).one()
            if row is None:
                raise LookupError(f"no pending rewind {rewind_id}")
            if row["request_id"] is not None:
                yield from self._requests.mark_done(row["request_id"])
            if anchor is not None:
                yield (
                    self._sql.cut,
                    (
                        anchor.session_id,
                        anchor.anchor_uuid,
                        anchor.target_message_id,
                        anchor.transcript_size,
                        anchor.drops_turn,
                        anchor.rewind_id,
                    ),
                )
            if points is not None:
                yield from self._points.write(points)
            return (yield from self._events.append(event, stamp, rewind_id))

        return await self._db.transaction(complete)

    async def abandon_rewind(self, rewind_id: str) -> None:
        def delete() -> Work[None]:
            row = (yield self._sql.abandon, (rewind_id,)).one()
            if row is not None and row["request_id"] is not None:
                yield from self._requests.delete(row["request_id"])

        await self._db.transaction(delete)

    async def rewind(self, rewind_id: str) -> RewindRecord | None:
        row = await self._db.row(self._sql.rewind, rewind_id)
        return self._record(row) if row is not None else None

    async def pending_rewinds(self, session_id: str | None = None) -> list[RewindRecord]:
        if session_id is None:
            rows = await self._db.rows(self._sql.pending)
        else:
            rows = await self._db.rows(self._sql.session_pending, session_id)
        return [self._record(r) for r in rows]

    async def rewinds(self, session_id: str | None = None) -> list[RewindRecord]:
        if session_id is None:
            rows = await self._db.rows(self._sql.rewinds)
        else:
            rows = await self._db.rows(self._sql.session_rewinds, session_id)
        return [self._record(r) for r in rows]

    # Pending conversation cuts

    async def anchor(self, session_id: str) -> Anchor | None:
        row = await self._db.row(self._sql.anchor, session_id)
        return self._anchor(row) if row is not None else None

    async def clear_anchor(self, session_id: str, anchor_uuid: str) -> None:
        await self._db.execute(self._sql.clear_anchor, session_id, anchor_uuid)

    def _record(self, row: Row) -> RewindRecord:
        d = self._d
        return RewindRecord(
            rewind_id=row["rewind_id"],
            session_id=row["session_id"],
            request_id=row["request_id"],
            message_id=row["message_id"],
            mode=row["mode"],
            state=row["state"],
            files_applied=bool(row["files_applied"]),
            plan=d.decode_json(row[d.SPELLING.plan]),
            result=d.decode_json(row[d.SPELLING.result]),
            principal=row["principal"],
            occur_time=d.decode_time(row["occur_time"]),
            kind=row["kind"],
            cursor=row["cursor"],
        )

    @staticmethod
    def _anchor(row: Row) -> Anchor:
        return Anchor(
            row["session_id"],
            row["anchor_uuid"],
            row["target_message_id"],
            int(row["transcript_size"]),
            row["drops_turn"],
            row["rewind_id"],
        )
