"""The event log watchers follow (`EventLog`), over SQL; and `append`, which the writes that
change a session's history run last in their transactions (the dialect spells the append: each
needs its own to keep the cursor gap-free)."""

from __future__ import annotations

from datetime import datetime

from agent_rewind.store.dialect import Row, Spelling, Work
from agent_rewind.store.records import EventRecord, NewEvent
from agent_rewind.store.sql.database import Database


class _Sql:
    """The event log's statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, s: Spelling) -> None:
        p = s.p
        self.after = f"SELECT * FROM events WHERE cursor > {p} ORDER BY cursor LIMIT {p}"
        self.session_after = (
            f"SELECT * FROM events WHERE session_id = {p} AND cursor > {p} ORDER BY cursor LIMIT {p}"
        )
        # One statement, one snapshot: the newest and the oldest agree.
        self.bounds = (
            "SELECT (SELECT value FROM counters WHERE name = 'event_cursor') AS newest,"
            " (SELECT MIN(cursor) FROM events) AS oldest"
        )
        # Always a prefix of the log (a clock set back must not punch holes in it).
        self.trim_older = (
            f"DELETE FROM events WHERE cursor <= (SELECT MAX(cursor) FROM events WHERE occur_time < {p})"
        )
        self.trim_beyond = (
            "DELETE FROM events WHERE cursor <= (SELECT value FROM counters WHERE name = 'event_cursor')"
            f" - {p}"
        )


class SqlEventLog:
    def __init__(self, db: Database) -> None:
        self._db, self._d = db, db.dialect
        self._sql = _Sql(db.dialect.SPELLING)

    def append(self, event: NewEvent, stamp: datetime, rewind_id: str | None = None) -> Work[EventRecord]:
        """Appends `event` (recording it on rewind `rewind_id`, if given): the transaction's last lock."""
        cursor = yield from self._d.append_event(event, stamp, rewind_id)
        return EventRecord(
            cursor, event.kind, event.session_id, event.rewind_id, event.principal, stamp, dict(event.data)
        )

    async def events_after(
        self, cursor: int, session_id: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        if session_id is None:
            rows = await self._db.rows(self._sql.after, cursor, limit)
        else:
            rows = await self._db.rows(self._sql.session_after, session_id, cursor, limit)
        return [self._record(row) for row in rows]

    async def event_bounds(self) -> tuple[int, int]:
        row = await self._db.row(self._sql.bounds)
        assert row is not None
        newest = int(row["newest"])
        if newest == 0:
            return 0, 0
        return (int(row["oldest"]) if row["oldest"] is not None else newest + 1), newest

    async def trim_events(self, keep: int | None, older_than: datetime | None) -> int:
        def trim() -> Work[int]:
            dropped = 0
            if older_than is not None:
                dropped += (yield self._sql.trim_older, (self._d.encode_time(older_than),)).rowcount
            if keep is not None:
                dropped += (yield self._sql.trim_beyond, (keep,)).rowcount
            return dropped

        return await self._db.transaction(trim)

    async def wait_for_events(self, seconds: float) -> None:
        await self._d.wait_for_events(seconds)

    def _record(self, row: Row) -> EventRecord:
        return EventRecord(
            cursor=int(row["cursor"]),
            kind=row["kind"],
            session_id=row["session_id"],
            rewind_id=row["rewind_id"],
            principal=row["principal"],
            occur_time=self._d.decode_time(row["occur_time"]),
            data=self._d.decode_json(row[self._d.SPELLING.data]),
        )
