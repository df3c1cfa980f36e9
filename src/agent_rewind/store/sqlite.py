"""The embedded ledger: one SQLite file under the state dir (WAL, synchronous=FULL).

`SqliteDialect`, the file as the stores of `store/sql/` use it, and `SqliteLedger`, those stores
over it. Their statements are spelled with `?` placeholders and the JSON columns' names as
SQLite's first schema gave them (`*_json`). Writes run in a worker thread (their fsync must not
hold up the event loop, nor every other session) on one connection, one IMMEDIATE transaction each
(SQLite's write lock, held for the whole transaction, is what keeps a registration from committing
during a fenced write), so when a call returns its write is on disk; but for a read's catch-up of
the points index, derived data committed without an fsync (`_UNSYNCED`), which only a crash of the
machine, so of this process too, can lose, and which runs on the event loop when no other write
holds the lock. Reads run inline on a second connection: WAL lets them proceed while a write
commits. The replica directory's leases are by this process's clock (one server uses the file).
The schema is versioned (`PRAGMA user_version`) and migrated forward at open, so a state dir
written by an older version is upgraded in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from agent_rewind.store.dialect import Dialect, Result, Row, Spelling, Work
from agent_rewind.store.records import NewEvent, NewRequest, SchemaTooNew, dumps, now
from agent_rewind.store.sql.ledger import SqlLedger

__all__ = ["MIGRATIONS", "SchemaTooNew", "SqliteDialect", "SqliteLedger"]

T = TypeVar("T")

# What says the file cannot be used, besides an OperationalError (locked, I/O, disk full) or an
# OSError: it is damaged, or not a database any more.
_DAMAGED = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)

# How every write commits: on disk when COMMIT returns (the log fsynced), the log folded into
# the file every 1,000 pages (SQLite's default).
_SYNCED = ("PRAGMA synchronous=FULL", "PRAGMA wal_autocheckpoint=1000")
# How a write that need not be durable (`_transact`) commits, that transaction only: its log
# frames written, not fsynced (lost, if at all, with the machine, so with this process, whose
# next start repairs what they held), and no checkpoint (one that does not sync the file before
# the log starts over could lose what synced commits wrote). The log is appended in order: the
# next synced commit's fsync makes these frames durable too.
_UNSYNCED = ("PRAGMA synchronous=OFF", "PRAGMA wal_autocheckpoint=0")

# An event's append: the next cursor, the event under it, and the rewind it records.
_NEXT_CURSOR = "UPDATE counters SET value = value + 1 WHERE name = 'event_cursor' RETURNING value"
_APPEND_EVENT = (
    "INSERT INTO events (cursor, kind, session_id, rewind_id, principal, occur_time, data_json)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_RECORD_CURSOR = "UPDATE rewinds SET cursor = ? WHERE rewind_id = ?"

# Each entry upgrades the schema by one version; never edit one that has shipped.
MIGRATIONS: tuple[str, ...] = (
    # 1: round 1.
    """
    CREATE TABLE IF NOT EXISTS sessions (
        session_id TEXT PRIMARY KEY,
        cwd TEXT NOT NULL,
        options_json TEXT NOT NULL,
        checkpointing INTEGER NOT NULL,
        create_time TEXT NOT NULL,
        update_time TEXT NOT NULL,
        closed INTEGER NOT NULL DEFAULT 0,
        started INTEGER NOT NULL DEFAULT 0,
        request_id TEXT
    );
    CREATE UNIQUE INDEX IF NOT EXISTS sessions_request_id ON sessions(request_id) WHERE request_id IS NOT NULL;
    CREATE TABLE IF NOT EXISTS anchors (
        session_id TEXT PRIMARY KEY REFERENCES sessions(session_id),
        anchor_uuid TEXT NOT NULL,
        target_message_id TEXT NOT NULL,
        transcript_size INTEGER NOT NULL,
        drops_turn TEXT,
        rewind_id TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS rewinds (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        cursor INTEGER UNIQUE,
        rewind_id TEXT NOT NULL UNIQUE,
        session_id TEXT NOT NULL REFERENCES sessions(session_id),
        request_id TEXT,
        fingerprint TEXT NOT NULL,
        message_id TEXT NOT NULL,
        mode TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'applied')),
        files_applied INTEGER NOT NULL DEFAULT 0,
        plan_json TEXT NOT NULL,
        result_json TEXT,
        principal TEXT NOT NULL DEFAULT '',
        occur_time TEXT NOT NULL
    );
    CREATE UNIQUE INDEX IF NOT EXISTS rewinds_request_id ON rewinds(request_id) WHERE request_id IS NOT NULL;
    CREATE INDEX IF NOT EXISTS rewinds_pending ON rewinds(state) WHERE state = 'pending';
    CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
    """,
    # 2: request ids for every idempotent call, the event log with its own counter, owners.
    """
    ALTER TABLE sessions ADD COLUMN principal TEXT NOT NULL DEFAULT '';
    ALTER TABLE sessions ADD COLUMN workspace_snapshots INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE rewinds ADD COLUMN kind TEXT NOT NULL DEFAULT 'rewind';
    CREATE TABLE requests (
        request_id TEXT PRIMARY KEY,
        method TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        session_id TEXT NOT NULL,
        done INTEGER NOT NULL DEFAULT 0,
        result_json TEXT,
        create_time TEXT NOT NULL
    );
    CREATE INDEX requests_create_time ON requests(create_time);
    INSERT INTO requests (request_id, method, fingerprint, session_id, done, create_time)
        SELECT request_id, 'CreateSession', '', session_id, 1, create_time FROM sessions
        WHERE request_id IS NOT NULL;
    INSERT INTO requests (request_id, method, fingerprint, session_id, done, result_json, create_time)
        SELECT request_id, 'Rewind', fingerprint, session_id, state = 'applied',
               json_object('rewind_id', rewind_id), occur_time
        FROM rewinds WHERE request_id IS NOT NULL;
    DROP INDEX sessions_request_id;
    DROP INDEX rewinds_request_id;
    CREATE TABLE events (
        cursor INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        session_id TEXT NOT NULL,
        rewind_id TEXT NOT NULL DEFAULT '',
        principal TEXT NOT NULL DEFAULT '',
        occur_time TEXT NOT NULL,
        data_json TEXT NOT NULL
    );
    CREATE INDEX events_session ON events(session_id, cursor);
    INSERT INTO events (cursor, kind, session_id, rewind_id, principal, occur_time, data_json)
        SELECT cursor, 'REWOUND', session_id, rewind_id, principal, occur_time,
               json_object('message_id', message_id, 'mode', lower(mode))
        FROM rewinds WHERE cursor IS NOT NULL;
    CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
    INSERT INTO counters (name, value) SELECT 'event_cursor', COALESCE(MAX(cursor), 0) FROM events;
    """,
    # 3: workspace snapshots, in the order they were taken.
    """
    CREATE TABLE snapshots (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('turn_start', 'turn_end', 'rewind_before', 'rewind_after')),
        ref TEXT NOT NULL,
        tree TEXT,
        complete INTEGER NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        occur_time TEXT NOT NULL
    );
    CREATE INDEX snapshots_session ON snapshots(session_id, seq);
    """,
    # 4: DeleteSession. A deleted session stays as a tombstone (its id, owner and creation time, so
    # the id is never reused), with what remains to erase on disk until that is done.
    """
    ALTER TABLE sessions ADD COLUMN deleted_time TEXT;
    ALTER TABLE sessions ADD COLUMN erasure_json TEXT;
    """,
    # 5: the replica directory, and which replica owns each session.
    """
    CREATE TABLE replicas (
        replica_id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        lease_expires TEXT NOT NULL
    );
    ALTER TABLE sessions ADD COLUMN replica TEXT NOT NULL DEFAULT '';
    """,
    # 6: where a fork came from; the hosts each turn's commands reached.
    """
    ALTER TABLE sessions ADD COLUMN forked_from_session TEXT NOT NULL DEFAULT '';
    ALTER TABLE sessions ADD COLUMN forked_from_message TEXT NOT NULL DEFAULT '';
    CREATE TABLE egress (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        prompt_id TEXT NOT NULL,
        host TEXT NOT NULL,
        port INTEGER NOT NULL,
        UNIQUE (session_id, prompt_id, host, port)
    );
    """,
    # 7: webhook delivery: each URL's cursor and lease (webhooks/), and the events it gave up on.
    """
    CREATE TABLE webhooks (
        url TEXT PRIMARY KEY,
        cursor INTEGER NOT NULL,
        holder TEXT NOT NULL DEFAULT '',
        lease_epoch INTEGER NOT NULL DEFAULT 0,
        lease_expires TEXT NOT NULL,
        delivered INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        last_error TEXT NOT NULL DEFAULT '',
        update_time TEXT NOT NULL
    );
    CREATE TABLE webhook_failures (
        url TEXT NOT NULL,
        cursor INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        error TEXT NOT NULL,
        occur_time TEXT NOT NULL,
        PRIMARY KEY (url, cursor)
    );
    """,
    # 8: the points index: each session's visible rewind points (store/sql/point_index.py, PointIndex).
    """
    CREATE TABLE point_heads (
        session_id TEXT PRIMARY KEY,
        covered INTEGER NOT NULL,
        digest TEXT NOT NULL,
        leaf TEXT NOT NULL,
        seed TEXT NOT NULL,
        points_count INTEGER NOT NULL,
        last_message_id TEXT NOT NULL,
        snapshot_count INTEGER NOT NULL,
        leaf_compactions INTEGER NOT NULL,
        holds_newest INTEGER NOT NULL,
        cut TEXT NOT NULL
    );
    CREATE TABLE points (
        session_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        uuid TEXT NOT NULL,
        message_id TEXT NOT NULL,
        resume_at_message_id TEXT NOT NULL,
        anchor TEXT NOT NULL,
        preview TEXT NOT NULL,
        create_time TEXT,
        snapshot_pos INTEGER,
        compactions INTEGER NOT NULL,
        is_copy INTEGER NOT NULL,
        PRIMARY KEY (session_id, idx)
    );
    CREATE INDEX points_uuid ON points(session_id, uuid);
    """,
    # 9: what each session holds, and how far retention pruned it (store/sql/storage.py).
    """
    CREATE TABLE session_storage (
        session_id TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        workspace_bytes INTEGER NOT NULL,
        history_bytes INTEGER NOT NULL,
        measure_time TEXT,
        files_pruned_before TEXT
    );
    CREATE INDEX session_storage_principal ON session_storage(principal);
    """,
    # 10: a page of points reads its own start snapshots and the newest unusable one, never the
    # session's whole history (store/sql/snapshot_order.py `snapshots_served`).
    """
    CREATE INDEX snapshots_ref ON snapshots(session_id, ref);
    CREATE INDEX snapshots_unusable ON snapshots(session_id, seq) WHERE complete = false OR tree IS NULL;
    """,
)


class SqliteDialect(Dialect):
    """The SQLite file the ledger lives in: its connections, transactions and spelling."""

    SPELLING = Spelling(
        p="?",
        share="",  # BEGIN IMMEDIATE holds the file's write lock until the transaction ends
        lock="",
        clock="?",  # this process's clock (one server uses the file)
        lease_end="?",
        options="options_json",
        plan="plan_json",
        result="result_json",
        data="data_json",
        erasure="erasure_json",
    )
    SCHEMA_VERSION = "SELECT user_version AS version FROM pragma_user_version"
    # (json_replace: a key an event does not have is not added.)
    BLANK_FILES = (
        "UPDATE events SET data_json = json_replace(data_json, '$.files.files_changed', json('[]'),"
        " '$.paths', json('[]'))"
        " WHERE session_id = ? AND (json_array_length(data_json, '$.files.files_changed') > 0"
        " OR json_array_length(data_json, '$.paths') > 0)"
    )

    def __init__(self, path: Path, busy_timeout: float = 5.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._busy_ms = int(busy_timeout * 1000)
        self._writer = self._connect()
        self._reader = self._connect()
        self._write_lock = threading.Lock()
        # Called when a write finds the volume full; True: space was freed, the write is retried
        # once (the storage reserve's release, storage/reserve.py).
        self.on_full: Callable[[], bool] = lambda: False
        try:
            self._migrate()
        except BaseException:
            self._writer.close()
            self._reader.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        _pragmas(db, _SYNCED)
        db.execute("PRAGMA foreign_keys=ON")
        # What is deleted (a DeleteSession's content above all) is overwritten with zeros, not left
        # in free pages for anyone who reads the file.
        db.execute("PRAGMA secure_delete=ON")
        # Another writer (a backup, an operator's sqlite3 shell) gets a few seconds, not an error.
        db.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        return db

    def _migrate(self) -> None:
        with self._write_lock:
            version = int(self._writer.execute("PRAGMA user_version").fetchone()[0])
            if version > len(MIGRATIONS):
                raise SchemaTooNew(version, len(MIGRATIONS))
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                self._writer.execute("BEGIN IMMEDIATE")
                try:
                    for statement in _statements(script):
                        self._writer.execute(statement)
                    self._writer.execute(f"PRAGMA user_version={number}")
                except BaseException:
                    self._writer.execute("ROLLBACK")
                    raise
                self._writer.execute("COMMIT")

    async def close(self) -> None:
        with self._write_lock:
            self._writer.close()
        self._reader.close()

    async def wait_for_events(self, seconds: float) -> None:
        await asyncio.sleep(seconds)  # one process writes the file: it publishes its own events

    async def transact(self, work: Callable[[], Work[T]], durable: bool) -> T:
        def run(wait: bool = True) -> T:
            if not durable:
                _pragmas(self._writer, _UNSYNCED if wait else (*_UNSYNCED, "PRAGMA busy_timeout=0"))
            try:
                self._writer.execute("BEGIN IMMEDIATE")
                try:
                    result = _run(self._writer, work())
                    self._writer.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        self._writer.execute("ROLLBACK")
                    raise
            finally:
                if not durable:
                    _pragmas(self._writer, (*_SYNCED, f"PRAGMA busy_timeout={self._busy_ms}"))
            return result

        def locked() -> T:
            with self._write_lock:
                try:
                    return run()
                except sqlite3.OperationalError as err:
                    # The volume is full: once more in the space the storage reserve frees.
                    if err.sqlite_errorcode & 0xFF != sqlite3.SQLITE_FULL or not self.on_full():
                        raise
                    return run()

        # Without its fsync a write costs tens of microseconds, less than a thread's round trip:
        # on the loop, unless another write holds the lock, here or (no busy wait) elsewhere.
        if not durable and self._write_lock.acquire(blocking=False):
            try:
                return run(wait=False)
            except sqlite3.OperationalError as err:
                if err.sqlite_errorcode & 0xFF == sqlite3.SQLITE_FULL and self.on_full():
                    return run(wait=False)
                if err.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:  # BEGIN found the file locked
                    raise
            finally:
                self._write_lock.release()
        return await asyncio.to_thread(locked)

    async def read(self, statement: str, args: tuple[Any, ...]) -> Sequence[Row]:
        rows: list[Row] = self._reader.execute(statement, args).fetchall()
        return rows

    def unavailable(self, err: BaseException) -> bool:
        if isinstance(err, sqlite3.OperationalError | OSError):  # locked, disk full, I/O error
            return True
        return isinstance(err, sqlite3.DatabaseError) and err.sqlite_errorcode & 0xFF in _DAMAGED

    def encode_time(self, value: datetime) -> str:
        return value.isoformat()

    def decode_time(self, value: Any) -> datetime:
        return datetime.fromisoformat(value)

    def encode_json(self, value: Any, *, text: bool = False) -> str | None:
        return dumps(value) if value is not None else None

    def decode_json(self, value: Any) -> Any:
        return json.loads(value) if value else None

    def clock_args(self) -> tuple[Any, ...]:
        return (now().isoformat(),)

    def lease_args(self, seconds: float) -> tuple[Any, ...]:
        return ((now() + timedelta(seconds=seconds)).isoformat(),)

    def legacy_columns(self, table: str, request: NewRequest | None) -> dict[str, Any]:
        # Schema 1 recorded a session's and a rewind's request on their own rows.
        if table == "sessions":
            return {"request_id": request.request_id if request else None}
        if table == "rewinds":
            return {"fingerprint": request.fingerprint if request else ""}
        return {}

    def append_event(self, event: NewEvent, stamp: datetime, rewind_id: str | None) -> Work[int]:
        row = (yield _NEXT_CURSOR, ()).one()
        assert row is not None
        cursor = int(row["value"])
        yield (
            _APPEND_EVENT,
            (
                cursor,
                event.kind,
                event.session_id,
                event.rewind_id,
                event.principal,
                stamp.isoformat(),
                dumps(event.data),
            ),
        )
        if rewind_id is not None:
            yield _RECORD_CURSOR, (cursor, rewind_id)
        return cursor

    async def erased(self, tables: Sequence[str], changed: bool) -> None:
        await asyncio.to_thread(self._truncate_wal)

    def _truncate_wal(self) -> None:
        """Folds the write-ahead log into the database file and truncates it to nothing: frames
        holding pages as they were before a deletion must not linger in the -wal file. A reader
        in the middle of a query holds it up for a moment, so it is tried a few times;
        after that the next erasure's checkpoint (or closing the ledger) truncates it."""
        with self._write_lock:
            for _ in range(5):
                try:
                    busy = self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                except sqlite3.OperationalError:
                    busy = 1
                if not busy:
                    return
                time.sleep(0.02)


class SqliteLedger(SqlLedger):
    """`Ledger` on an SQLite file. Open with `await SqliteLedger.open(path)`."""

    dialect: SqliteDialect

    def __init__(self, path: Path, busy_timeout: float = 5.0) -> None:
        super().__init__(SqliteDialect(path, busy_timeout))
        self.path = path

    @classmethod
    async def open(cls, path: Path, busy_timeout: float = 5.0) -> SqliteLedger:
        return await asyncio.to_thread(cls, path, busy_timeout)


def _pragmas(db: sqlite3.Connection, pragmas: tuple[str, ...]) -> None:
    for pragma in pragmas:
        db.execute(pragma)


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _run(db: sqlite3.Connection, work: Work[T]) -> T:
    """Runs a write's statements on `db`, each one's result sent back into `work`."""
    try:
        statement = next(work)
        while True:
            cursor = db.execute(*statement)
            rows = cursor.fetchall()  # a RETURNING statement's rowcount is known once it is read
            statement = work.send(Result(rows, cursor.rowcount))
    except StopIteration as done:
        answer: T = done.value
        return answer
    finally:
        work.close()
