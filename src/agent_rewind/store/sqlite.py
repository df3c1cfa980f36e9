"""The embedded ledger: one SQLite file under the state dir (WAL, synchronous=FULL).

Writes run in a worker thread (their fsync must not hold up the event loop, nor every other
session) on one connection, one transaction each, so when a call returns its write is on disk.
Reads run inline on a second connection: WAL lets them proceed while a write commits. The schema
is versioned (`PRAGMA user_version`) and migrated forward at open, so a state dir written by an
older version is upgraded in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from agent_rewind import metrics
from agent_rewind.errors import ReplicaUnavailable, SessionAlreadyExists, StorageUnavailable
from agent_rewind.store.ledger import (
    FENCED,
    Anchor,
    EventRecord,
    NewEvent,
    NewRequest,
    NewRewind,
    NewSession,
    NewSnapshot,
    ReplicaRecord,
    RequestIdTaken,
    RequestRecord,
    RewindRecord,
    SchemaTooNew,
    SessionRecord,
    SnapshotRecord,
    Tombstone,
    dumps,
    now,
)

T = TypeVar("T")


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
)


def _check_fence(db: sqlite3.Connection, replica_id: str, epoch: int) -> None:
    """Inside a write's transaction (which holds SQLite's write lock: no registration can commit
    before it ends): ReplicaUnavailable unless `epoch` is still the replica's epoch."""
    row = db.execute("SELECT epoch FROM replicas WHERE replica_id = ?", (replica_id,)).fetchone()
    if row is None or row["epoch"] != epoch:
        raise ReplicaUnavailable(replica_id, FENCED)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


class SqliteLedger:
    """`Ledger` on an SQLite file. Open with `await SqliteLedger.open(path)`."""

    def __init__(self, path: Path, busy_timeout: float = 5.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._busy_ms = int(busy_timeout * 1000)
        self._writer = self._connect()
        self._reader = self._connect()
        self._write_lock = threading.Lock()
        self._fence: tuple[str, int] | None = None  # (replica id, epoch) every write must hold
        try:
            self._migrate()
        except BaseException:
            self._writer.close()
            self._reader.close()
            raise

    @classmethod
    async def open(cls, path: Path, busy_timeout: float = 5.0) -> SqliteLedger:
        return await asyncio.to_thread(cls, path, busy_timeout)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
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

    async def schema_version(self) -> int:
        return int(self._reader.execute("PRAGMA user_version").fetchone()[0])

    async def close(self) -> None:
        with self._write_lock:
            self._writer.close()
        self._reader.close()

    # Plumbing

    async def _write(self, work: Callable[[sqlite3.Connection], T], *, fenced: bool = True) -> T:
        """Runs `work` in one IMMEDIATE transaction, off the event loop; `fenced`: only while
        this replica's epoch is current (`fence`)."""

        def run() -> T:
            with self._write_lock:
                try:
                    self._writer.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as err:  # locked by another writer
                    raise StorageUnavailable(str(err)) from err
                try:
                    if fenced and self._fence is not None:
                        _check_fence(self._writer, *self._fence)
                    result = work(self._writer)
                    self._writer.execute("COMMIT")
                except BaseException as err:
                    with contextlib.suppress(sqlite3.Error):
                        self._writer.execute("ROLLBACK")
                    if isinstance(err, sqlite3.OperationalError | OSError):  # disk full, I/O error
                        raise StorageUnavailable(str(err)) from err
                    raise
                return result

        started = time.perf_counter()
        try:
            return await asyncio.to_thread(run)
        except BaseException:
            metrics.LEDGER_WRITE_FAILURES.inc()
            raise
        finally:
            metrics.LEDGER_WRITE_SECONDS.observe(time.perf_counter() - started)

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        return list(self._reader.execute(sql, args).fetchall())

    # Secrets

    async def secret(self, name: str, size: int = 32) -> bytes:
        rows = self._rows("SELECT value FROM secrets WHERE name = ?", (name,))
        if rows:
            return bytes(rows[0]["value"])

        def insert(db: sqlite3.Connection) -> bytes:
            db.execute(
                "INSERT INTO secrets (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (name, os.urandom(size)),
            )
            return bytes(db.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()["value"])

        return await self._write(insert)

    # Sessions

    @staticmethod
    def _session(row: sqlite3.Row) -> SessionRecord:
        return SessionRecord(
            session_id=row["session_id"],
            cwd=row["cwd"],
            options=_loads(row["options_json"]),
            checkpointing=bool(row["checkpointing"]),
            create_time=_time(row["create_time"]),
            update_time=_time(row["update_time"]),
            closed=bool(row["closed"]),
            started=bool(row["started"]),
            principal=row["principal"],
            workspace_snapshots=bool(row["workspace_snapshots"]),
            replica=row["replica"],
        )

    async def add_session(self, new: NewSession, request: NewRequest | None = None) -> SessionRecord:
        stamp = now().isoformat()

        def insert(db: sqlite3.Connection) -> None:
            if request is not None:
                _insert_request(db, request, stamp)
            if db.execute("SELECT 1 FROM sessions WHERE session_id = ?", (new.session_id,)).fetchone():
                raise SessionAlreadyExists(new.session_id)  # a tombstone's id included
            db.execute(
                "INSERT INTO sessions (session_id, cwd, options_json, checkpointing, create_time, update_time,"
                " principal, workspace_snapshots, request_id, replica) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    new.session_id,
                    new.cwd,
                    dumps(new.options),
                    int(new.checkpointing),
                    stamp,
                    stamp,
                    new.principal,
                    int(new.workspace_snapshots),
                    request.request_id if request else None,
                    new.replica,
                ),
            )

        await self._write(insert)
        record = await self.session(new.session_id)
        assert record is not None
        return record

    # The replica directory (one replica per SQLite file; kept for the same answers as elsewhere)

    @staticmethod
    def _replica(row: sqlite3.Row, at: datetime) -> ReplicaRecord:
        expires = _time(row["lease_expires"])
        return ReplicaRecord(row["replica_id"], row["address"], row["epoch"], expires, expires > at)

    async def register_replica(self, replica_id: str, address: str, lease_s: float) -> ReplicaRecord:
        def upsert(db: sqlite3.Connection) -> ReplicaRecord:
            at = now()
            db.execute(
                "INSERT INTO replicas (replica_id, address, epoch, lease_expires) VALUES (?, ?, 1, ?)"
                " ON CONFLICT (replica_id) DO UPDATE SET address = excluded.address,"
                " epoch = replicas.epoch + 1, lease_expires = excluded.lease_expires",
                (replica_id, address, (at + timedelta(seconds=lease_s)).isoformat()),
            )
            row = db.execute("SELECT * FROM replicas WHERE replica_id = ?", (replica_id,)).fetchone()
            return self._replica(row, at)

        return await self._write(upsert, fenced=False)

    async def renew_replica(self, replica_id: str, epoch: int, lease_s: float) -> ReplicaRecord | None:
        def renew(db: sqlite3.Connection) -> ReplicaRecord | None:
            at = now()
            row = db.execute(
                "UPDATE replicas SET lease_expires = ? WHERE replica_id = ? AND epoch = ? RETURNING *",
                ((at + timedelta(seconds=lease_s)).isoformat(), replica_id, epoch),
            ).fetchone()
            return self._replica(row, at) if row is not None else None

        return await self._write(renew, fenced=False)

    async def retire_replica(self, replica_id: str, epoch: int) -> None:
        def retire(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE replicas SET lease_expires = ? WHERE replica_id = ? AND epoch = ?",
                (now().isoformat(), replica_id, epoch),
            )

        await self._write(retire, fenced=False)

    async def take_over(self, replica_id: str, by: str) -> list[str] | None:
        def take(db: sqlite3.Connection) -> list[str] | None:
            fenced = db.execute(
                "UPDATE replicas SET epoch = epoch + 1 WHERE replica_id = ? AND lease_expires <= ?",
                (replica_id, now().isoformat()),
            ).rowcount
            if not fenced:
                return None
            rows = db.execute(
                "UPDATE sessions SET replica = ? WHERE replica = ? RETURNING session_id", (by, replica_id)
            ).fetchall()
            return sorted(r["session_id"] for r in rows)

        return await self._write(take)

    async def replicas(self) -> list[ReplicaRecord]:
        at = now()
        return [self._replica(r, at) for r in self._rows("SELECT * FROM replicas ORDER BY replica_id")]

    def fence(self, replica_id: str, epoch: int) -> None:
        self._fence = (replica_id, epoch)

    async def wait_for_events(self, seconds: float) -> None:
        await asyncio.sleep(seconds)  # one process writes the file: it publishes its own events

    async def remove_session(self, session_id: str) -> None:
        def delete(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM requests WHERE session_id = ? AND method = 'CreateSession'", (session_id,)
            )
            db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))

        await self._write(delete)

    async def session(self, session_id: str) -> SessionRecord | None:
        rows = self._rows(
            "SELECT * FROM sessions WHERE session_id = ? AND deleted_time IS NULL", (session_id,)
        )
        return self._session(rows[0]) if rows else None

    async def sessions(self) -> list[SessionRecord]:
        rows = self._rows(
            "SELECT * FROM sessions WHERE deleted_time IS NULL ORDER BY create_time, session_id"
        )
        return [self._session(r) for r in rows]

    async def claim_sessions(self, replica_id: str, *, every: bool = False) -> int:
        claimed = "replica != ?" if every else "replica = ''"
        args = (replica_id, replica_id) if every else (replica_id,)

        def claim(db: sqlite3.Connection) -> int:
            return db.execute(f"UPDATE sessions SET replica = ? WHERE {claimed}", args).rowcount

        return await self._write(claim)

    async def session_counts(self) -> dict[str, int]:
        rows = self._rows(
            "SELECT replica, COUNT(*) AS n FROM sessions WHERE deleted_time IS NULL GROUP BY replica"
        )
        return {r["replica"]: int(r["n"]) for r in rows}

    async def touch_session(
        self, session_id: str, *, closed: bool | None = None, started: bool | None = None
    ) -> datetime:
        stamp = now()
        sets, args = ["update_time = ?"], [stamp.isoformat()]
        if closed is not None:
            sets.append("closed = ?")
            args.append(str(int(closed)))
        if started is not None:
            sets.append("started = ?")
            args.append(str(int(started)))
        sql = f"UPDATE sessions SET {', '.join(sets)} WHERE session_id = ?"
        await self._write(lambda db: db.execute(sql, (*args, session_id)))
        return stamp

    # Request ids

    async def request(self, request_id: str) -> RequestRecord | None:
        rows = self._rows("SELECT * FROM requests WHERE request_id = ?", (request_id,))
        return _request(rows[0]) if rows else None

    async def begin_request(self, request: NewRequest, result: dict[str, Any] | None = None) -> None:
        stamp = now().isoformat()
        await self._write(lambda db: _insert_request(db, request, stamp, result))

    async def finish_request(self, request_id: str, result: dict[str, Any]) -> None:
        await self._write(
            lambda db: db.execute(
                "UPDATE requests SET done = 1, result_json = ? WHERE request_id = ?",
                (dumps(result), request_id),
            )
        )

    async def forget_request(self, request_id: str) -> None:
        await self._write(lambda db: db.execute("DELETE FROM requests WHERE request_id = ?", (request_id,)))

    async def forget_requests(self, older_than: datetime) -> int:
        def delete(db: sqlite3.Connection) -> int:
            return db.execute(
                "DELETE FROM requests WHERE create_time < ?", (older_than.isoformat(),)
            ).rowcount

        return await self._write(delete)

    # Pending conversation cuts

    async def anchor(self, session_id: str) -> Anchor | None:
        rows = self._rows("SELECT * FROM anchors WHERE session_id = ?", (session_id,))
        if not rows:
            return None
        r = rows[0]
        return Anchor(
            r["session_id"],
            r["anchor_uuid"],
            r["target_message_id"],
            r["transcript_size"],
            r["drops_turn"],
            r["rewind_id"],
        )

    async def clear_anchor(self, session_id: str, anchor_uuid: str) -> None:
        await self._write(
            lambda db: db.execute(
                "DELETE FROM anchors WHERE session_id = ? AND anchor_uuid = ?", (session_id, anchor_uuid)
            )
        )

    # Rewinds

    @staticmethod
    def _rewind(row: sqlite3.Row) -> RewindRecord:
        return RewindRecord(
            rewind_id=row["rewind_id"],
            session_id=row["session_id"],
            request_id=row["request_id"],
            message_id=row["message_id"],
            mode=row["mode"],
            state=row["state"],
            files_applied=bool(row["files_applied"]),
            plan=_loads(row["plan_json"]),
            result=_loads(row["result_json"]) if row["result_json"] else None,
            principal=row["principal"],
            occur_time=_time(row["occur_time"]),
            kind=row["kind"],
            cursor=row["cursor"],
        )

    async def begin_rewind(self, new: NewRewind) -> None:
        stamp = now().isoformat()

        def insert(db: sqlite3.Connection) -> None:
            if new.request is not None:
                _insert_request(db, new.request, stamp, result={"rewind_id": new.rewind_id})
            db.execute(
                "INSERT INTO rewinds (rewind_id, session_id, request_id, fingerprint, message_id, mode, state,"
                " plan_json, principal, occur_time, kind) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
                (
                    new.rewind_id,
                    new.session_id,
                    new.request.request_id if new.request else None,
                    new.request.fingerprint if new.request else "",
                    new.message_id,
                    new.mode,
                    dumps(new.plan),
                    new.principal,
                    stamp,
                    new.kind,
                ),
            )

        await self._write(insert)

    async def mark_files_applied(self, rewind_id: str) -> None:
        await self._write(
            lambda db: db.execute("UPDATE rewinds SET files_applied = 1 WHERE rewind_id = ?", (rewind_id,))
        )

    async def complete_rewind(
        self, rewind_id: str, result: dict[str, Any], anchor: Anchor | None, event: NewEvent
    ) -> EventRecord:
        stamp = now().isoformat()

        def complete(db: sqlite3.Connection) -> EventRecord:
            cursor = _append_event(db, event, stamp)
            changed = db.execute(
                "UPDATE rewinds SET state = 'applied', result_json = ?, cursor = ?"
                " WHERE rewind_id = ? AND state = 'pending'",
                (dumps(result), cursor, rewind_id),
            ).rowcount
            if changed != 1:
                raise LookupError(f"no pending rewind {rewind_id}")
            db.execute(
                "UPDATE requests SET done = 1 WHERE request_id = (SELECT request_id FROM rewinds WHERE rewind_id = ?)",
                (rewind_id,),
            )
            if anchor is not None:
                db.execute(
                    "INSERT INTO anchors (session_id, anchor_uuid, target_message_id, transcript_size,"
                    " drops_turn, rewind_id) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET"
                    " anchor_uuid = excluded.anchor_uuid, target_message_id = excluded.target_message_id,"
                    " transcript_size = excluded.transcript_size, drops_turn = excluded.drops_turn,"
                    " rewind_id = excluded.rewind_id",
                    (
                        anchor.session_id,
                        anchor.anchor_uuid,
                        anchor.target_message_id,
                        anchor.transcript_size,
                        anchor.drops_turn,
                        anchor.rewind_id,
                    ),
                )
            db.execute(
                "UPDATE sessions SET update_time = ? WHERE session_id = (SELECT session_id FROM rewinds"
                " WHERE rewind_id = ?)",
                (stamp, rewind_id),
            )
            return _appended(cursor, event, stamp)

        return await self._write(complete)

    async def abandon_rewind(self, rewind_id: str) -> None:
        def delete(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM requests WHERE request_id = (SELECT request_id FROM rewinds"
                " WHERE rewind_id = ? AND state = 'pending')",
                (rewind_id,),
            )
            db.execute("DELETE FROM rewinds WHERE rewind_id = ? AND state = 'pending'", (rewind_id,))

        await self._write(delete)

    async def rewind(self, rewind_id: str) -> RewindRecord | None:
        rows = self._rows("SELECT * FROM rewinds WHERE rewind_id = ?", (rewind_id,))
        return self._rewind(rows[0]) if rows else None

    async def pending_rewinds(self, session_id: str | None = None) -> list[RewindRecord]:
        if session_id is None:
            rows = self._rows("SELECT * FROM rewinds WHERE state = 'pending' ORDER BY id")
        else:
            rows = self._rows(
                "SELECT * FROM rewinds WHERE state = 'pending' AND session_id = ? ORDER BY id", (session_id,)
            )
        return [self._rewind(r) for r in rows]

    async def rewinds(self, session_id: str | None = None) -> list[RewindRecord]:
        if session_id is None:
            return [self._rewind(r) for r in self._rows("SELECT * FROM rewinds ORDER BY id")]
        rows = self._rows("SELECT * FROM rewinds WHERE session_id = ? ORDER BY id", (session_id,))
        return [self._rewind(r) for r in rows]

    # Workspace snapshots

    async def add_snapshot(self, new: NewSnapshot) -> SnapshotRecord:
        stamp = now()

        def insert(db: sqlite3.Connection) -> int:
            cursor = db.execute(
                "INSERT INTO snapshots (session_id, kind, ref, tree, complete, reason, occur_time)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    new.session_id,
                    new.kind,
                    new.ref,
                    new.tree,
                    int(new.complete),
                    new.reason,
                    stamp.isoformat(),
                ),
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

        seq = await self._write(insert)
        return SnapshotRecord(
            seq, new.session_id, new.kind, new.ref, new.tree, new.complete, new.reason, stamp
        )

    async def snapshots(self, session_id: str) -> list[SnapshotRecord]:
        rows = self._rows("SELECT * FROM snapshots WHERE session_id = ? ORDER BY seq", (session_id,))
        return [_snapshot(row) for row in rows]

    async def prune_snapshots(self, session_id: str, before_seq: int) -> int:
        def prune(db: sqlite3.Connection) -> int:
            return db.execute(
                "UPDATE snapshots SET tree = NULL, complete = 0, reason = 'pruned'"
                " WHERE session_id = ? AND seq < ? AND tree IS NOT NULL",
                (session_id, before_seq),
            ).rowcount

        return await self._write(prune)

    # The event log

    async def events_after(
        self, cursor: int, session_id: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        if session_id is None:
            rows = self._rows(
                "SELECT * FROM events WHERE cursor > ? ORDER BY cursor LIMIT ?", (cursor, limit)
            )
        else:
            rows = self._rows(
                "SELECT * FROM events WHERE session_id = ? AND cursor > ? ORDER BY cursor LIMIT ?",
                (session_id, cursor, limit),
            )
        return [_event(r) for r in rows]

    async def event_bounds(self) -> tuple[int, int]:
        newest = int(self._rows("SELECT value FROM counters WHERE name = 'event_cursor'")[0]["value"])
        oldest = self._rows("SELECT MIN(cursor) AS c FROM events")[0]["c"]
        if newest == 0:
            return 0, 0
        return (int(oldest) if oldest is not None else newest + 1), newest

    async def trim_events(self, keep: int | None, older_than: datetime | None) -> int:
        def trim(db: sqlite3.Connection) -> int:
            dropped = 0
            if older_than is not None:
                # Always a prefix of the log (a clock set back must not punch holes in it).
                dropped += db.execute(
                    "DELETE FROM events WHERE cursor <= (SELECT MAX(cursor) FROM events WHERE occur_time < ?)",
                    (older_than.isoformat(),),
                ).rowcount
            if keep is not None:
                dropped += db.execute(
                    "DELETE FROM events WHERE cursor <= (SELECT value FROM counters WHERE name = 'event_cursor') - ?",
                    (keep,),
                ).rowcount
            return dropped

        return await self._write(trim)

    # Erasure

    async def erase_session(
        self,
        session_id: str,
        event: NewEvent,
        request: NewRequest | None = None,
        erasure: dict[str, Any] | None = None,
    ) -> EventRecord:
        stamp = now().isoformat()

        def erase(db: sqlite3.Connection) -> EventRecord:
            live = db.execute(
                "SELECT 1 FROM sessions WHERE session_id = ? AND deleted_time IS NULL", (session_id,)
            ).fetchone()
            if live is None:
                raise LookupError(f"no session {session_id}")
            if request is not None:
                taken = db.execute(
                    "SELECT * FROM requests WHERE request_id = ?", (request.request_id,)
                ).fetchone()
                if taken is not None:
                    raise RequestIdTaken(_request(taken))
            db.execute(
                "UPDATE sessions SET cwd = '', options_json = '{}', request_id = NULL, closed = 1,"
                " update_time = ?, deleted_time = ?, erasure_json = ? WHERE session_id = ?",
                (stamp, stamp, dumps(erasure) if erasure is not None else None, session_id),
            )
            db.execute("DELETE FROM anchors WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM rewinds WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM snapshots WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM requests WHERE session_id = ?", (session_id,))
            # The events stay (cursors are gap-free, and watchers must learn of the deletion), but
            # the paths a rewind changed are the workspace's content: they go.
            db.execute(
                "UPDATE events SET data_json = json_set(data_json, '$.files.files_changed', json('[]'))"
                " WHERE session_id = ? AND json_type(data_json, '$.files.files_changed') = 'array'"
                " AND json_array_length(data_json, '$.files.files_changed') > 0",
                (session_id,),
            )
            if request is not None:
                _insert_request(db, request, stamp, result={})
                db.execute("UPDATE requests SET done = 1 WHERE request_id = ?", (request.request_id,))
            cursor = _append_event(db, event, stamp)
            return _appended(cursor, event, stamp)

        committed = await self._write(erase)
        await asyncio.to_thread(self._truncate_wal)
        return committed

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

    @staticmethod
    def _tombstone(row: sqlite3.Row) -> Tombstone:
        return Tombstone(
            session_id=row["session_id"],
            principal=row["principal"],
            create_time=_time(row["create_time"]),
            deleted_time=_time(row["deleted_time"]),
            erasure=_loads(row["erasure_json"]) if row["erasure_json"] else None,
            replica=row["replica"],
        )

    async def tombstone(self, session_id: str) -> Tombstone | None:
        rows = self._rows(
            "SELECT * FROM sessions WHERE session_id = ? AND deleted_time IS NOT NULL", (session_id,)
        )
        return self._tombstone(rows[0]) if rows else None

    async def unfinished_erasures(self) -> list[Tombstone]:
        rows = self._rows(
            "SELECT * FROM sessions WHERE deleted_time IS NOT NULL AND erasure_json IS NOT NULL"
            " ORDER BY deleted_time, session_id"
        )
        return [self._tombstone(r) for r in rows]

    async def finish_erasure(self, session_id: str) -> None:
        await self._write(
            lambda db: db.execute(
                "UPDATE sessions SET erasure_json = NULL WHERE session_id = ? AND deleted_time IS NOT NULL",
                (session_id,),
            )
        )
        await asyncio.to_thread(self._truncate_wal)


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _loads(text: str) -> Any:
    import json

    return json.loads(text)


def _snapshot(row: sqlite3.Row) -> SnapshotRecord:
    return SnapshotRecord(
        seq=int(row["seq"]),
        session_id=row["session_id"],
        kind=row["kind"],
        ref=row["ref"],
        tree=row["tree"],
        complete=bool(row["complete"]),
        reason=row["reason"],
        occur_time=_time(row["occur_time"]),
    )


def _request(row: sqlite3.Row) -> RequestRecord:
    return RequestRecord(
        request_id=row["request_id"],
        method=row["method"],
        fingerprint=row["fingerprint"],
        session_id=row["session_id"],
        done=bool(row["done"]),
        result=_loads(row["result_json"]) if row["result_json"] else None,
        create_time=_time(row["create_time"]),
    )


def _insert_request(
    db: sqlite3.Connection, request: NewRequest, stamp: str, result: dict[str, Any] | None = None
) -> None:
    existing = db.execute("SELECT * FROM requests WHERE request_id = ?", (request.request_id,)).fetchone()
    if existing is not None:
        raise RequestIdTaken(_request(existing))
    db.execute(
        "INSERT INTO requests (request_id, method, fingerprint, session_id, result_json, create_time)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (
            request.request_id,
            request.method,
            request.fingerprint,
            request.session_id,
            dumps(result) if result is not None else None,
            stamp,
        ),
    )


def _append_event(db: sqlite3.Connection, event: NewEvent, stamp: str) -> int:
    cursor = int(
        db.execute(
            "UPDATE counters SET value = value + 1 WHERE name = 'event_cursor' RETURNING value"
        ).fetchone()[0]
    )
    db.execute(
        "INSERT INTO events (cursor, kind, session_id, rewind_id, principal, occur_time, data_json)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (cursor, event.kind, event.session_id, event.rewind_id, event.principal, stamp, dumps(event.data)),
    )
    return cursor


def _appended(cursor: int, event: NewEvent, stamp: str) -> EventRecord:
    return EventRecord(
        cursor, event.kind, event.session_id, event.rewind_id, event.principal, _time(stamp), dict(event.data)
    )


def _event(row: sqlite3.Row) -> EventRecord:
    return EventRecord(
        cursor=row["cursor"],
        kind=row["kind"],
        session_id=row["session_id"],
        rewind_id=row["rewind_id"],
        principal=row["principal"],
        occur_time=_time(row["occur_time"]),
        data=_loads(row["data_json"]),
    )
