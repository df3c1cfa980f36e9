"""The replica directory (`ReplicaDirectory`) over SQL: each replica's address, epoch and lease,
by the dialect's clock (the database's, where it has one); and the fence, the check that keeps
a replica's writes from committing once a newer incarnation has registered."""

from __future__ import annotations

from agent_rewind.errors import ReplicaUnavailable
from agent_rewind.store.dialect import Row, Spelling, Work
from agent_rewind.store.records import FENCED, ReplicaRecord
from agent_rewind.store.sql.database import Database


class Fence:
    """The (replica id, epoch) every write must hold, once `hold` has set one."""

    def __init__(self, s: Spelling) -> None:
        self._held: tuple[str, int] | None = None
        # `share` (or SQLite's write lock) keeps a registration from committing before the write does.
        self._epoch = f"SELECT epoch FROM replicas WHERE replica_id = {s.p}{s.share}"

    def hold(self, replica_id: str, epoch: int) -> None:
        self._held = (replica_id, epoch)

    def check(self) -> Work[None]:
        """Inside a write's transaction, first: ReplicaUnavailable unless this replica's epoch is
        still the directory's."""
        if self._held is None:
            return
        replica_id, epoch = self._held
        row = (yield self._epoch, (replica_id,)).one()
        if row is None or row["epoch"] != epoch:
            raise ReplicaUnavailable(replica_id, FENCED)


class _Sql:
    """The directory's statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, s: Spelling) -> None:
        p = s.p
        replica = f"replica_id, address, epoch, lease_expires, lease_expires > {s.clock} AS alive"
        self.register = (
            "INSERT INTO replicas (replica_id, address, epoch, lease_expires)"
            f" VALUES ({p}, {p}, 1, {s.lease_end}) ON CONFLICT (replica_id) DO UPDATE SET"
            " address = excluded.address, epoch = replicas.epoch + 1,"
            f" lease_expires = excluded.lease_expires RETURNING {replica}"
        )
        self.renew = (
            f"UPDATE replicas SET lease_expires = {s.lease_end} WHERE replica_id = {p} AND epoch = {p}"
            f" RETURNING {replica}"
        )
        self.retire = f"UPDATE replicas SET lease_expires = {s.clock} WHERE replica_id = {p} AND epoch = {p}"
        self.fence_off = (
            f"UPDATE replicas SET epoch = epoch + 1 WHERE replica_id = {p} AND lease_expires <= {s.clock}"
        )
        self.move_sessions = f"UPDATE sessions SET replica = {p} WHERE replica = {p} RETURNING session_id"
        self.replicas = f"SELECT {replica} FROM replicas ORDER BY replica_id"


class SqlReplicaDirectory:
    def __init__(self, db: Database, fence: Fence) -> None:
        self._db, self._d, self._fence = db, db.dialect, fence
        self._sql = _Sql(db.dialect.SPELLING)

    def fence(self, replica_id: str, epoch: int) -> None:
        self._fence.hold(replica_id, epoch)

    async def register_replica(self, replica_id: str, address: str, lease_s: float) -> ReplicaRecord:
        args = (replica_id, address, *self._d.lease_args(lease_s), *self._d.clock_args())

        def upsert() -> Work[ReplicaRecord]:
            row = (yield self._sql.register, args).one()
            assert row is not None
            return self._record(row)

        return await self._db.transaction(upsert, fenced=False)

    async def renew_replica(self, replica_id: str, epoch: int, lease_s: float) -> ReplicaRecord | None:
        args = (*self._d.lease_args(lease_s), replica_id, epoch, *self._d.clock_args())

        def renew() -> Work[ReplicaRecord | None]:
            row = (yield self._sql.renew, args).one()
            return self._record(row) if row is not None else None

        return await self._db.transaction(renew, fenced=False)

    async def retire_replica(self, replica_id: str, epoch: int) -> None:
        await self._db.execute(self._sql.retire, *self._d.clock_args(), replica_id, epoch, fenced=False)

    async def take_over(self, replica_id: str, by: str) -> list[str] | None:
        clock = self._d.clock_args()

        def take() -> Work[list[str] | None]:
            if not (yield self._sql.fence_off, (replica_id, *clock)).rowcount:
                return None
            moved = yield self._sql.move_sessions, (by, replica_id)
            return sorted(r["session_id"] for r in moved.rows)

        return await self._db.transaction(take)

    async def replicas(self) -> list[ReplicaRecord]:
        return [self._record(r) for r in await self._db.rows(self._sql.replicas, *self._d.clock_args())]

    def _record(self, row: Row) -> ReplicaRecord:
        expires = self._d.decode_time(row["lease_expires"])
        return ReplicaRecord(
            row["replica_id"], row["address"], int(row["epoch"]), expires, bool(row["alive"])
        )
