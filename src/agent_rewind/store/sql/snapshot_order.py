"""The order a session's workspace snapshots were taken in (`SnapshotOrder`), over SQL."""

from __future__ import annotations

from collections.abc import Sequence

from agent_rewind.store.dialect import Row, Spelling, Work
from agent_rewind.store.records import NewSnapshot, SnapshotRecord, now
from agent_rewind.store.sql.database import Database


class _Sql:
    """The snapshots table's statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, s: Spelling) -> None:
        p = s.p
        self.insert = (
            "INSERT INTO snapshots (session_id, kind, ref, tree, complete, reason, occur_time)"
            f" VALUES ({s.marks(7)}) RETURNING seq"
        )
        self.snapshots = f"SELECT * FROM snapshots WHERE session_id = {p} ORDER BY seq"
        self.newest = f"SELECT COALESCE(MAX(seq), 0) AS seq FROM snapshots WHERE session_id = {p}"
        # (The condition is the partial index snapshots_unusable's, so it is read, not the table.)
        self.unusable = (
            "SELECT COALESCE(MAX(seq), 0) AS seq FROM snapshots"
            f" WHERE session_id = {p} AND (complete = false OR tree IS NULL)"
        )
        self._starts = (
            "SELECT ref, MAX(seq) AS seq FROM snapshots"
            f" WHERE session_id = {p} AND kind = 'turn_start' AND ref IN ({{refs}}) GROUP BY ref"
        )
        self._p = p
        self.prune = (
            "UPDATE snapshots SET tree = NULL, complete = false, reason = 'pruned'"
            f" WHERE session_id = {p} AND seq < {p} AND tree IS NOT NULL"
        )

    def starts(self, count: int) -> str:
        """The newest turn-start record of each of `count` prompts."""
        return self._starts.format(refs=", ".join([self._p] * count))


class SqlSnapshotOrder:
    def __init__(self, db: Database) -> None:
        self._db, self._d = db, db.dialect
        self._sql = _Sql(db.dialect.SPELLING)

    async def add_snapshot(self, new: NewSnapshot) -> SnapshotRecord:
        stamp = now()
        args = (
            new.session_id,
            new.kind,
            new.ref,
            new.tree,
            new.complete,
            new.reason,
            self._d.encode_time(stamp),
        )

        def insert() -> Work[int]:
            row = (yield self._sql.insert, args).one()
            assert row is not None
            return int(row["seq"])

        seq = await self._db.transaction(insert)
        return SnapshotRecord(
            seq, new.session_id, new.kind, new.ref, new.tree, new.complete, new.reason, stamp
        )

    async def snapshots(self, session_id: str) -> list[SnapshotRecord]:
        return [self._record(row) for row in await self._db.rows(self._sql.snapshots, session_id)]

    async def newest_snapshot(self, session_id: str) -> int:
        row = await self._db.row(self._sql.newest, session_id)
        return int(row["seq"]) if row is not None else 0

    async def snapshots_served(self, session_id: str, refs: Sequence[str]) -> dict[str, bool]:
        wanted = sorted(set(refs))
        if not wanted:
            return {}
        rows = await self._db.rows(self._sql.starts(len(wanted)), session_id, *wanted)
        if not rows:
            return {}
        row = await self._db.row(self._sql.unusable, session_id)
        unusable = int(row["seq"]) if row is not None else 0
        return {str(r["ref"]): int(r["seq"]) > unusable for r in rows}

    async def prune_snapshots(self, session_id: str, before_seq: int) -> int:
        return await self._db.execute(self._sql.prune, session_id, before_seq)

    def _record(self, row: Row) -> SnapshotRecord:
        return SnapshotRecord(
            seq=int(row["seq"]),
            session_id=row["session_id"],
            kind=row["kind"],
            ref=row["ref"],
            tree=row["tree"],
            complete=bool(row["complete"]),
            reason=row["reason"],
            occur_time=self._d.decode_time(row["occur_time"]),
        )
