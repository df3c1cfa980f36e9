"""Each session's row (`Sessions`), and the hosts its turns reached (`Egress`), over SQL."""

from __future__ import annotations

from datetime import datetime

from agent_rewind.errors import SessionAlreadyExists
from agent_rewind.store.dialect import Dialect, Row, Spelling, Work
from agent_rewind.store.records import (
    EgressRecord,
    ForkOrigin,
    NewRequest,
    NewSession,
    SessionRecord,
    now,
)
from agent_rewind.store.sql.database import Database
from agent_rewind.store.sql.request_ids import SqlRequests


class _Sql:
    """A session's statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, d: Dialect) -> None:
        s, p = d.SPELLING, d.SPELLING.p
        columns = (
            "session_id",
            "cwd",
            s.options,
            "checkpointing",
            "create_time",
            "update_time",
            "principal",
            "workspace_snapshots",
            "replica",
            "forked_from_session",
            "forked_from_message",
            *d.legacy_columns("sessions", None),
        )
        self.insert = (
            f"INSERT INTO sessions ({', '.join(columns)}) VALUES ({s.marks(len(columns))})"
            " ON CONFLICT (session_id) DO NOTHING RETURNING *"
        )
        self.forget_creation = f"DELETE FROM requests WHERE session_id = {p} AND method = 'CreateSession'"
        self.delete = f"DELETE FROM sessions WHERE session_id = {p}"
        self.session = f"SELECT * FROM sessions WHERE session_id = {p} AND deleted_time IS NULL"
        self.sessions = "SELECT * FROM sessions WHERE deleted_time IS NULL ORDER BY create_time, session_id"
        self.touch = (
            f"UPDATE sessions SET update_time = {p}, closed = COALESCE({p}, closed),"
            f" started = COALESCE({p}, started) WHERE session_id = {p}"
        )
        self.claim_every = f"UPDATE sessions SET replica = {p} WHERE replica <> {p}"
        self.claim_unowned = f"UPDATE sessions SET replica = {p} WHERE replica = ''"
        self.counts = (
            "SELECT replica, COUNT(*) AS n FROM sessions WHERE deleted_time IS NULL GROUP BY replica"
        )


class SqlSessions:
    def __init__(self, db: Database, requests: SqlRequests) -> None:
        self._db, self._d, self._requests = db, db.dialect, requests
        self._sql = _Sql(db.dialect)

    async def add_session(self, new: NewSession, request: NewRequest | None = None) -> SessionRecord:
        stamp = now()
        d = self._d
        args = (
            new.session_id,
            new.cwd,
            d.encode_json(new.options),
            new.checkpointing,
            d.encode_time(stamp),
            d.encode_time(stamp),
            new.principal,
            new.workspace_snapshots,
            new.replica,
            new.forked_from.session_id if new.forked_from else "",
            new.forked_from.message_id if new.forked_from else "",
            *d.legacy_columns("sessions", request).values(),
        )

        def insert() -> Work[SessionRecord]:
            if request is not None:
                yield from self._requests.insert(request, stamp)
            row = (yield self._sql.insert, args).one()
            if row is None:  # the id is taken (a tombstone's included), maybe by another replica
                raise SessionAlreadyExists(new.session_id)
            return self._record(row)

        return await self._db.transaction(insert)

    async def remove_session(self, session_id: str) -> None:
        def delete() -> Work[None]:
            yield self._sql.forget_creation, (session_id,)
            yield self._sql.delete, (session_id,)

        await self._db.transaction(delete)

    async def session(self, session_id: str) -> SessionRecord | None:
        row = await self._db.row(self._sql.session, session_id)
        return self._record(row) if row is not None else None

    async def sessions(self) -> list[SessionRecord]:
        return [self._record(r) for r in await self._db.rows(self._sql.sessions)]

    async def touch_session(
        self, session_id: str, *, closed: bool | None = None, started: bool | None = None
    ) -> datetime:
        stamp = now()
        await self._db.execute(self._sql.touch, self._d.encode_time(stamp), closed, started, session_id)
        return stamp

    async def claim_sessions(self, replica_id: str, *, every: bool = False) -> int:
        if every:
            return await self._db.execute(self._sql.claim_every, replica_id, replica_id)
        return await self._db.execute(self._sql.claim_unowned, replica_id)

    async def session_counts(self) -> dict[str, int]:
        return {r["replica"]: int(r["n"]) for r in await self._db.rows(self._sql.counts)}

    def _record(self, row: Row) -> SessionRecord:
        d = self._d
        return SessionRecord(
            session_id=row["session_id"],
            cwd=row["cwd"],
            options=d.decode_json(row[d.SPELLING.options]),
            checkpointing=bool(row["checkpointing"]),
            create_time=d.decode_time(row["create_time"]),
            update_time=d.decode_time(row["update_time"]),
            closed=bool(row["closed"]),
            started=bool(row["started"]),
            principal=row["principal"],
            workspace_snapshots=bool(row["workspace_snapshots"]),
            replica=row["replica"],
            forked_from=(
                ForkOrigin(row["forked_from_session"], row["forked_from_message"])
                if row["forked_from_session"]
                else None
            ),
        )


class _EgressSql:
    """The egress table's statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, s: Spelling) -> None:
        self.record = (
            f"INSERT INTO egress (session_id, prompt_id, host, port) VALUES ({s.marks(4)})"
            " ON CONFLICT (session_id, prompt_id, host, port) DO NOTHING"
        )
        self.egress = (
            f"SELECT session_id, prompt_id, host, port FROM egress WHERE session_id = {s.p} ORDER BY seq"
        )


class SqlEgress:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._sql = _EgressSql(db.dialect.SPELLING)

    async def record_egress(self, record: EgressRecord) -> None:
        await self._db.execute(
            self._sql.record, record.session_id, record.prompt_id, record.host, record.port
        )

    async def egress(self, session_id: str) -> list[EgressRecord]:
        rows = await self._db.rows(self._sql.egress, session_id)
        return [EgressRecord(r["session_id"], r["prompt_id"], r["host"], int(r["port"])) for r in rows]
