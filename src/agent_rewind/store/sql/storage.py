"""What each session holds on the server's volumes, as last measured, and how far retention has
pruned its files history (`StorageBook`), over SQL: one row a session."""

from __future__ import annotations

from datetime import datetime

from agent_rewind.store.dialect import Row, Spelling
from agent_rewind.store.records import StorageRecord, now
from agent_rewind.store.sql.database import Database


class _Sql:
    """The session_storage table's statements, as the dialect spells them: made once."""

    def __init__(self, s: Spelling) -> None:
        p = s.p
        # Only of a session that exists: a measurement that ends after the session's erasure
        # writes nothing.
        self.record = (
            "INSERT INTO session_storage (session_id, principal, workspace_bytes, history_bytes, measure_time)"
            f" SELECT {s.marks(5)} WHERE EXISTS (SELECT 1 FROM sessions WHERE session_id = {p}"
            " AND deleted_time IS NULL) ON CONFLICT (session_id) DO UPDATE SET"
            " workspace_bytes = excluded.workspace_bytes, history_bytes = excluded.history_bytes,"
            " measure_time = excluded.measure_time"
        )
        self.one = f"SELECT * FROM session_storage WHERE session_id = {p}"
        self.principal = (
            "SELECT COALESCE(SUM(workspace_bytes + history_bytes), 0) AS used FROM session_storage"
            f" WHERE principal = {p}"
        )
        self.totals = (
            "SELECT COALESCE(SUM(workspace_bytes), 0) AS workspace, COALESCE(SUM(history_bytes), 0) AS history,"
            " COUNT(*) AS sessions FROM session_storage"
        )
        # Only ever later: a pruned point never becomes rewindable again.
        self.pruned = (
            "INSERT INTO session_storage (session_id, principal, workspace_bytes, history_bytes,"
            f" measure_time, files_pruned_before) VALUES ({p}, {p}, 0, 0, NULL, {p})"
            " ON CONFLICT (session_id) DO UPDATE SET files_pruned_before = excluded.files_pruned_before"
            " WHERE session_storage.files_pruned_before IS NULL"
            " OR session_storage.files_pruned_before < excluded.files_pruned_before"
        )


class SqlStorageBook:
    def __init__(self, db: Database) -> None:
        self._db, self._d = db, db.dialect
        self._sql = _Sql(db.dialect.SPELLING)

    async def record_usage(
        self, session_id: str, principal: str, workspace_bytes: int, history_bytes: int
    ) -> None:
        when = self._d.encode_time(now())
        await self._db.execute(
            self._sql.record, session_id, principal, workspace_bytes, history_bytes, when, session_id
        )

    async def usage(self, session_id: str) -> StorageRecord | None:
        row = await self._db.row(self._sql.one, session_id)
        return self._record(row) if row is not None else None

    async def principal_usage(self, principal: str) -> int:
        row = await self._db.row(self._sql.principal, principal)
        return int(row["used"]) if row is not None else 0

    async def usage_totals(self) -> tuple[int, int, int]:
        row = await self._db.row(self._sql.totals)
        assert row is not None
        return int(row["workspace"]), int(row["history"]), int(row["sessions"])

    async def mark_files_pruned(self, session_id: str, principal: str, before: datetime) -> None:
        await self._db.execute(self._sql.pruned, session_id, principal, self._d.encode_time(before))

    def _record(self, row: Row) -> StorageRecord:
        measured, pruned = row["measure_time"], row["files_pruned_before"]
        return StorageRecord(
            session_id=row["session_id"],
            principal=row["principal"],
            workspace_bytes=int(row["workspace_bytes"]),
            history_bytes=int(row["history_bytes"]),
            measure_time=self._d.decode_time(measured) if measured is not None else None,
            files_pruned_before=self._d.decode_time(pruned) if pruned is not None else None,
        )
