"""DeleteSession over SQL (`Erasure`): in one transaction, the session's row becomes a tombstone and
everything else it wrote goes (the events stay, their file paths blanked); then the dialect cleans
what deleted must not linger in its files."""

from __future__ import annotations

from typing import Any

from agent_rewind.store.dialect import Dialect, Row, Work
from agent_rewind.store.records import EventRecord, NewEvent, NewRequest, Tombstone, now
from agent_rewind.store.sql.database import Database
from agent_rewind.store.sql.event_log import SqlEventLog
from agent_rewind.store.sql.request_ids import SqlRequests

# What an erasure deletes or rewrites rows of (what a dialect cleans after it commits).
ERASED_TABLES = (
    "sessions",
    "anchors",
    "rewinds",
    "snapshots",
    "requests",
    "events",
    "egress",
    "point_heads",
    "points",
    "session_storage",
)


class _Sql:
    """An erasure's statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, d: Dialect) -> None:
        s, p = d.SPELLING, d.SPELLING.p
        blanked = "".join(f", {name} = {p}" for name in d.legacy_columns("sessions", None))
        self.live = f"SELECT 1 FROM sessions WHERE session_id = {p} AND deleted_time IS NULL{s.lock}"
        self.tombstone = (
            f"UPDATE sessions SET cwd = '', {s.options} = '{{}}', closed = true, update_time = {p},"
            f" deleted_time = {p}, {s.erasure} = {p}{blanked} WHERE session_id = {p}"
        )
        # The points index holds the prompts' text.
        self.deletes = tuple(
            f"DELETE FROM {table} WHERE session_id = {p}"
            for table in (
                "anchors",
                "rewinds",
                "snapshots",
                "egress",
                "points",
                "point_heads",
                "session_storage",
            )
        )
        # Every request id of the session but the delete's own.
        self.requests = f"DELETE FROM requests WHERE session_id = {p} AND request_id IS DISTINCT FROM {p}"
        self.get = f"SELECT * FROM sessions WHERE session_id = {p} AND deleted_time IS NOT NULL"
        self.unfinished = (
            f"SELECT * FROM sessions WHERE deleted_time IS NOT NULL AND {s.erasure} IS NOT NULL"
            " ORDER BY deleted_time, session_id"
        )
        self.finish = (
            f"UPDATE sessions SET {s.erasure} = NULL WHERE session_id = {p} AND deleted_time IS NOT NULL"
            f" AND {s.erasure} IS NOT NULL"
        )


class SqlErasure:
    def __init__(self, db: Database, requests: SqlRequests, events: SqlEventLog) -> None:
        self._db, self._d, self._requests, self._events = db, db.dialect, requests, events
        self._sql = _Sql(db.dialect)

    async def erase_session(
        self,
        session_id: str,
        event: NewEvent,
        request: NewRequest | None = None,
        erasure: dict[str, Any] | None = None,
    ) -> EventRecord:
        stamp = now()
        d = self._d
        tombstone = (
            d.encode_time(stamp),
            d.encode_time(stamp),
            d.encode_json(erasure),
            *d.legacy_columns("sessions", None).values(),
            session_id,
        )

        def erase() -> Work[EventRecord]:
            if (yield self._sql.live, (session_id,)).one() is None:
                raise LookupError(f"no session {session_id}")
            if request is not None:
                yield from self._requests.insert(request, stamp, result={}, done=True)
            yield self._sql.tombstone, tombstone
            for delete in self._sql.deletes:
                yield delete, (session_id,)
            yield self._sql.requests, (session_id, request.request_id if request is not None else None)
            # The events stay (cursors are gap-free, and watchers must learn of the deletion), but
            # the paths a rewind changed are the workspace's content: they go.
            yield d.BLANK_FILES, (session_id,)
            return (yield from self._events.append(event, stamp))

        committed = await self._db.transaction(erase)
        await d.erased(ERASED_TABLES, True)
        return committed

    async def tombstone(self, session_id: str) -> Tombstone | None:
        row = await self._db.row(self._sql.get, session_id)
        return self._record(row) if row is not None else None

    async def unfinished_erasures(self) -> list[Tombstone]:
        return [self._record(r) for r in await self._db.rows(self._sql.unfinished)]

    async def finish_erasure(self, session_id: str) -> None:
        changed = await self._db.execute(self._sql.finish, session_id)
        await self._d.erased(("sessions",), bool(changed))

    def _record(self, row: Row) -> Tombstone:
        d = self._d
        return Tombstone(
            session_id=row["session_id"],
            principal=row["principal"],
            create_time=d.decode_time(row["create_time"]),
            deleted_time=d.decode_time(row["deleted_time"]),
            erasure=d.decode_json(row[d.SPELLING.erasure]),
            replica=row["replica"],
        )
