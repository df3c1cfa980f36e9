"""The dialect interface of the SQL ledger: what each database supplies, and what they share.

`store/sql.py` holds every ledger method once; a dialect (`store/sqlite.py`,
`store/postgres.py`) runs its statements. A write is a generator of statements (`Work`): the
dialect runs it in one transaction and sends each statement's result back in, so the same body
runs in SQLite's writer thread and on PostgreSQL's async connections. Statements are spelled as
SQLite spells them (`?` placeholders, the JSON columns named `*_json`, as SQLite's first schema
named them); PostgreSQL's dialect translates both, and its rows' column names back.

A dialect supplies (the abstract methods of `Dialect`): its transactions, with the lock that
keeps a fenced write and a new registration apart; its reads; which of its errors mean the
database cannot be used now; how it stores times and JSON; the few statements that differ (the
clock of leases, appending an event, blanking an event's file paths); the columns only SQLite's
older schema has; what follows an erasure; and its own migrations. What they share is here: one
error mapping for reads and writes (a dialect's "unavailable" error is StorageUnavailable either
way), the write metrics, the fencing check, and the rows read back into records.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol, TypeVar

from agent_rewind import metrics
from agent_rewind.errors import ReplicaUnavailable, StorageUnavailable
from agent_rewind.store.ledger import (
    FENCED,
    Anchor,
    EventRecord,
    ForkOrigin,
    NewEvent,
    NewRequest,
    ReplicaRecord,
    RequestRecord,
    RewindRecord,
    SessionRecord,
    SnapshotRecord,
    Tombstone,
)

T = TypeVar("T")


class Row(Protocol):
    """A row as either database returns it: its columns by name."""

    def __getitem__(self, key: str, /) -> Any: ...


@dataclass(frozen=True)
class Result:
    """What a statement gave back: its rows (none for most writes) and how many it changed."""

    rows: Sequence[Row]
    rowcount: int

    def one(self) -> Row | None:
        return self.rows[0] if self.rows else None


# A statement and its arguments.
Statement = tuple[str, tuple[Any, ...]]
# A write's body: yields each statement, is sent its result, returns the write's answer.
Work = Generator[Statement, Result, T]


def insert_statement(table: str, columns: dict[str, Any]) -> Statement:
    names = ", ".join(columns)
    marks = ", ".join("?" * len(columns))
    return f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(columns.values())


class Dialect(ABC):
    """What a database supplies to the SQL core (`store/sql.py`), and the plumbing they share."""

    # Appended to the fencing check's read of the directory's row: holds off a registration
    # until the write's transaction ends.
    SHARE: ClassVar[str]
    # Appended to the read of a row the transaction is about to change.
    LOCK: ClassVar[str]
    # Blanks the file paths of a session's earlier events (one argument: the session id).
    BLANK_FILES: ClassVar[str]

    def __init__(self) -> None:
        self._fence: tuple[str, int] | None = None  # (replica id, epoch) every write must hold

    # What each dialect supplies

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def schema_version(self) -> int: ...

    @abstractmethod
    async def wait_for_events(self, seconds: float) -> None: ...

    @abstractmethod
    async def _transact(self, work: Callable[[], Work[T]], fenced: bool, durable: bool) -> T:
        """Runs `work` in one transaction, durable once this returns; `fenced`: after
        `_check_fence`, in the same transaction. Not `durable`: derived data that a crash may
        lose (`PointIndex.record_points`), committed without waiting for the disk where the
        dialect can lose it only with this process (see the dialects)."""

    @abstractmethod
    async def _read(self, statement: str, args: tuple[Any, ...]) -> list[Row]: ...

    @abstractmethod
    def _unavailable(self, err: BaseException) -> bool:
        """Whether `err` means the database cannot be used now (retryable): StorageUnavailable."""

    @abstractmethod
    def _encode_time(self, value: datetime) -> Any: ...

    @abstractmethod
    def _decode_time(self, value: Any) -> datetime: ...

    @abstractmethod
    def _encode_json(self, value: Any, *, text: bool = False) -> Any:
        """A JSON column's value (None for None); `text`: a column that keeps the text as given."""

    @abstractmethod
    def _decode_json(self, value: Any) -> Any: ...

    @abstractmethod
    def _clock(self) -> tuple[str, tuple[Any, ...]]:
        """The time leases are measured by: an expression and its arguments."""

    @abstractmethod
    def _lease_end(self, seconds: float) -> tuple[str, tuple[Any, ...]]:
        """That time `seconds` from now: an expression and its arguments."""

    @abstractmethod
    def _legacy_columns(self, table: str, request: NewRequest | None) -> dict[str, Any]:
        """Columns an older schema of the dialect has and still fills, for a new row of `table`."""

    @abstractmethod
    def _append_event(self, event: NewEvent, stamp: datetime, rewind_id: str | None) -> Work[int]:
        """Appends `event` under the next cursor (recording it on rewind `rewind_id`, if given),
        the last lock the transaction takes; returns the cursor."""

    @abstractmethod
    async def _erased(self, tables: Sequence[str], changed: bool) -> None:
        """After an erasure commits (`changed`: it changed rows): what deleted must not linger."""

    # Plumbing: one error mapping for every read and write

    async def _transaction(
        self, work: Callable[[], Work[T]], *, fenced: bool = True, durable: bool = True
    ) -> T:
        started = time.perf_counter()
        try:
            return await self._transact(work, fenced, durable)
        except BaseException as err:
            metrics.LEDGER_WRITE_FAILURES.inc()
            if self._unavailable(err):
                raise StorageUnavailable(str(err)) from err
            raise
        finally:
            metrics.LEDGER_WRITE_SECONDS.observe(time.perf_counter() - started)

    async def _execute(self, statement: str, *args: Any, fenced: bool = True) -> int:
        """One statement as a write of its own; how many rows it changed."""

        def work() -> Work[int]:
            return (yield statement, args).rowcount

        return await self._transaction(work, fenced=fenced)

    async def _rows(self, statement: str, *args: Any) -> list[Row]:
        try:
            return await self._read(statement, args)
        except Exception as err:
            if self._unavailable(err):
                raise StorageUnavailable(str(err)) from err
            raise

    async def _row(self, statement: str, *args: Any) -> Row | None:
        rows = await self._rows(statement, *args)
        return rows[0] if rows else None

    def _check_fence(self) -> Work[None]:
        """Inside a write's transaction, first: ReplicaUnavailable unless this replica's epoch is
        still the directory's (`SHARE`, or SQLite's write lock, keeps a registration from
        committing before the write does)."""
        if self._fence is None:
            return
        replica_id, epoch = self._fence
        sql = f"SELECT epoch FROM replicas WHERE replica_id = ?{self.SHARE}"
        row = (yield sql, (replica_id,)).one()
        if row is None or row["epoch"] != epoch:
            raise ReplicaUnavailable(replica_id, FENCED)

    def fence(self, replica_id: str, epoch: int) -> None:
        self._fence = (replica_id, epoch)

    # Rows read back into records

    def _session(self, row: Row) -> SessionRecord:
        return SessionRecord(
            session_id=row["session_id"],
            cwd=row["cwd"],
            options=self._decode_json(row["options_json"]),
            checkpointing=bool(row["checkpointing"]),
            create_time=self._decode_time(row["create_time"]),
            update_time=self._decode_time(row["update_time"]),
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

    def _replica(self, row: Row) -> ReplicaRecord:
        expires = self._decode_time(row["lease_expires"])
        return ReplicaRecord(
            row["replica_id"], row["address"], int(row["epoch"]), expires, bool(row["alive"])
        )

    def _request(self, row: Row) -> RequestRecord:
        return RequestRecord(
            request_id=row["request_id"],
            method=row["method"],
            fingerprint=row["fingerprint"],
            session_id=row["session_id"],
            done=bool(row["done"]),
            result=self._decode_json(row["result_json"]),
            create_time=self._decode_time(row["create_time"]),
        )

    def _rewind(self, row: Row) -> RewindRecord:
        return RewindRecord(
            rewind_id=row["rewind_id"],
            session_id=row["session_id"],
            request_id=row["request_id"],
            message_id=row["message_id"],
            mode=row["mode"],
            state=row["state"],
            files_applied=bool(row["files_applied"]),
            plan=self._decode_json(row["plan_json"]),
            result=self._decode_json(row["result_json"]),
            principal=row["principal"],
            occur_time=self._decode_time(row["occur_time"]),
            kind=row["kind"],
            cursor=row["cursor"],
        )

    def _tombstone(self, row: Row) -> Tombstone:
        return Tombstone(
            session_id=row["session_id"],
            principal=row["principal"],
            create_time=self._decode_time(row["create_time"]),
            deleted_time=self._decode_time(row["deleted_time"]),
            erasure=self._decode_json(row["erasure_json"]),
            replica=row["replica"],
        )

    def _anchor(self, row: Row) -> Anchor:
        return Anchor(
            row["session_id"],
            row["anchor_uuid"],
            row["target_message_id"],
            int(row["transcript_size"]),
            row["drops_turn"],
            row["rewind_id"],
        )

    def _snapshot(self, row: Row) -> SnapshotRecord:
        return SnapshotRecord(
            seq=int(row["seq"]),
            session_id=row["session_id"],
            kind=row["kind"],
            ref=row["ref"],
            tree=row["tree"],
            complete=bool(row["complete"]),
            reason=row["reason"],
            occur_time=self._decode_time(row["occur_time"]),
        )

    def _event(self, row: Row) -> EventRecord:
        return EventRecord(
            cursor=int(row["cursor"]),
            kind=row["kind"],
            session_id=row["session_id"],
            rewind_id=row["rewind_id"],
            principal=row["principal"],
            occur_time=self._decode_time(row["occur_time"]),
            data=self._decode_json(row["data_json"]),
        )
