"""The request ids that make calls idempotent (`Requests`), over SQL; and the statements of the
requests table that other writes run in their own transactions (a session's creation, a rewind's
intent, an erasure record their request with what they write)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent_rewind.store.dialect import Row, Spelling, Work
from agent_rewind.store.records import NewRequest, RequestIdTaken, RequestRecord, now
from agent_rewind.store.sql.database import Database


class _Sql:
    """The requests table's statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, s: Spelling) -> None:
        p = s.p
        self.insert = (
            f"INSERT INTO requests (request_id, method, fingerprint, session_id, done, {s.result},"
            f" create_time) VALUES ({s.marks(7)}) ON CONFLICT (request_id) DO NOTHING RETURNING 1"
        )
        self.request = f"SELECT * FROM requests WHERE request_id = {p}"
        self.finish = f"UPDATE requests SET done = true, {s.result} = {p} WHERE request_id = {p}"
        self.done = f"UPDATE requests SET done = true WHERE request_id = {p}"
        self.forget = f"DELETE FROM requests WHERE request_id = {p}"
        self.forget_older = f"DELETE FROM requests WHERE create_time < {p}"


class SqlRequests:
    def __init__(self, db: Database) -> None:
        self._db, self._d = db, db.dialect
        self._sql = _Sql(db.dialect.SPELLING)

    def insert(
        self,
        request: NewRequest,
        stamp: datetime,
        result: dict[str, Any] | None = None,
        *,
        done: bool = False,
    ) -> Work[None]:
        """Records a request id, or raises RequestIdTaken with the record that has it. A concurrent
        insert of the same id is waited for: its row is then found, or, rolled back, this one goes in."""
        args = (
            request.request_id,
            request.method,
            request.fingerprint,
            request.session_id,
            done,
            self._d.encode_json(result, text=True),
            self._d.encode_time(stamp),
        )
        while True:
            if (yield self._sql.insert, args).rows:
                return
            existing = (yield self._sql.request, (request.request_id,)).one()
            if existing is not None:
                raise RequestIdTaken(self._record(existing))
            # Deleted between the two statements (forgotten by another replica): try again.

    def mark_done(self, request_id: str) -> Work[None]:
        yield self._sql.done, (request_id,)

    def delete(self, request_id: str) -> Work[None]:
        yield self._sql.forget, (request_id,)

    async def request(self, request_id: str) -> RequestRecord | None:
        row = await self._db.row(self._sql.request, request_id)
        return self._record(row) if row is not None else None

    async def begin_request(self, request: NewRequest, result: dict[str, Any] | None = None) -> None:
        stamp = now()
        await self._db.transaction(lambda: self.insert(request, stamp, result))

    async def finish_request(self, request_id: str, result: dict[str, Any]) -> None:
        await self._db.execute(self._sql.finish, self._d.encode_json(result, text=True), request_id)

    async def forget_request(self, request_id: str) -> None:
        await self._db.execute(self._sql.forget, request_id)

    async def forget_requests(self, older_than: datetime) -> int:
        return await self._db.execute(self._sql.forget_older, self._d.encode_time(older_than))

    def _record(self, row: Row) -> RequestRecord:
        return RequestRecord(
            request_id=row["request_id"],
            method=row["method"],
            fingerprint=row["fingerprint"],
            session_id=row["session_id"],
            done=bool(row["done"]),
            result=self._d.decode_json(row[self._d.SPELLING.result]),
            create_time=self._d.decode_time(row["create_time"]),
        )
