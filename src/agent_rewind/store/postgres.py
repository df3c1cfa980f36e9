"""The ledger on PostgreSQL, for several replicas of the service sharing one database.

The same observable behaviour as `store/sqlite.py`, with what a server shared by several writers
asks for:

- Every write is one transaction (READ COMMITTED, whatever the database's default) on a pooled
  connection (psycopg 3, async), durable when its call returns: `synchronous_commit` is put back
  on for the ledger's connections if the database turned it off (stricter settings are kept).
- The event cursor is gap-free for the whole deployment: each append updates the `counters` row
  in the transaction that inserts the event, so the row's lock serializes writers and a rollback
  gives the number back (a SEQUENCE would leave gaps). The counter is the last lock a write takes,
  and writes that touch a session lock its row first, so writers do not deadlock; cursors commit
  in their order, so a reader never sees cursor n + 1 before n.
- Request ids are inserted with ON CONFLICT DO NOTHING: a concurrent insert of the same id waits
  for the other transaction, then finds its row (RequestIdTaken), never an aborted transaction.
- The schema is versioned (`agent_rewind_schema`) and migrated at open, one transaction per
  version under a transaction-level advisory lock, so replicas starting together do not race; a
  database written by a newer version is refused (SchemaTooNew) and left as it is.
- A lost server (refused connection, administrator shutdown, a full disk, a lock held longer than
  `lock_timeout`) is StorageUnavailable, for reads as for writes.

Times are `timestamptz` (returned in UTC, as SQLite's are), JSON is `jsonb`, except a request's
result: it may hold a model's text, which may hold NUL, which `jsonb` refuses; `json` keeps the
text as given. Tables live in the connection's `search_path` (a deployment may give the ledger a
schema of its own with `options=-csearch_path=...` in the URL).

Erasure: PostgreSQL keeps the old versions of deleted and updated rows in the table's files until
VACUUM, which cannot run inside a transaction. After DeleteSession's transaction commits (and after
`finish_erasure`), the tables it touched are vacuumed on an autocommit connection, best effort: a
failure (a lock held past `lock_timeout`) is logged, not raised, and a row version a snapshot still
open elsewhere (another replica's long read) can see stays until the next VACUUM. PostgreSQL has no
equivalent of SQLite's `secure_delete`: a plain VACUUM frees the space in a page but does not
overwrite it (a page the session shared with others keeps the bytes until later rows reuse the
space; pages left empty at a table's end are cut off). `vacuum_full=True` runs VACUUM FULL instead,
which rewrites each table and its indexes into new files and drops the old ones, so nothing of the
session is left in the tables' files; it holds an exclusive lock on each table while it copies it
(every replica's calls on that table wait: cheap for a small ledger, not for a large one). Either
way, the write-ahead log holds what was written until its segments are recycled, and base backups,
WAL archives and standbys keep their copies: only a deployment that controls those can promise
that nothing of a deleted session survives on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import structlog
from psycopg import AsyncConnection, IsolationLevel, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Json, Jsonb
from psycopg_pool import AsyncConnectionPool

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

if TYPE_CHECKING:
    from agent_rewind.store.ledger import Ledger

T = TypeVar("T")
Connection = AsyncConnection[DictRow]

log = structlog.get_logger(__name__)

__all__ = ["MIGRATIONS", "PostgresLedger", "SchemaTooNew"]

# pg_advisory_xact_lock's key for migrations: "agrw" "schm" in ASCII, so it is recognizable in
# pg_locks and unlikely to be any other application's.
SCHEMA_LOCK = 0x61677277_7363686D

# Each entry upgrades the schema by one version, in one transaction; never edit one that has shipped.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the schema of SQLite's version 4 (its legacy columns left out).
    (
        """
        CREATE TABLE sessions (
            session_id text COLLATE "C" PRIMARY KEY,
            cwd text NOT NULL,
            options jsonb NOT NULL,
            checkpointing boolean NOT NULL,
            create_time timestamptz NOT NULL,
            update_time timestamptz NOT NULL,
            closed boolean NOT NULL DEFAULT false,
            started boolean NOT NULL DEFAULT false,
            principal text NOT NULL DEFAULT '',
            workspace_snapshots boolean NOT NULL DEFAULT false,
            deleted_time timestamptz,
            erasure jsonb
        )
        """,
        """
        CREATE TABLE anchors (
            session_id text COLLATE "C" PRIMARY KEY REFERENCES sessions (session_id),
            anchor_uuid text NOT NULL,
            target_message_id text NOT NULL,
            transcript_size bigint NOT NULL,
            drops_turn text,
            rewind_id text NOT NULL
        )
        """,
        """
        CREATE TABLE rewinds (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            cursor bigint UNIQUE,
            rewind_id text COLLATE "C" NOT NULL UNIQUE,
            session_id text COLLATE "C" NOT NULL REFERENCES sessions (session_id),
            request_id text COLLATE "C",
            kind text NOT NULL DEFAULT 'rewind',
            message_id text NOT NULL,
            mode text NOT NULL,
            state text NOT NULL CHECK (state IN ('pending', 'applied')),
            files_applied boolean NOT NULL DEFAULT false,
            plan jsonb NOT NULL,
            result jsonb,
            principal text NOT NULL DEFAULT '',
            occur_time timestamptz NOT NULL
        )
        """,
        "CREATE INDEX rewinds_session ON rewinds (session_id, id)",
        "CREATE INDEX rewinds_pending ON rewinds (id) WHERE state = 'pending'",
        """
        CREATE TABLE requests (
            request_id text COLLATE "C" PRIMARY KEY,
            method text NOT NULL,
            fingerprint text NOT NULL,
            session_id text COLLATE "C" NOT NULL,
            done boolean NOT NULL DEFAULT false,
            result json,
            create_time timestamptz NOT NULL
        )
        """,
        "CREATE INDEX requests_create_time ON requests (create_time)",
        "CREATE INDEX requests_session ON requests (session_id)",
        """
        CREATE TABLE events (
            cursor bigint PRIMARY KEY,
            kind text NOT NULL,
            session_id text COLLATE "C" NOT NULL,
            rewind_id text NOT NULL DEFAULT '',
            principal text NOT NULL DEFAULT '',
            occur_time timestamptz NOT NULL,
            data jsonb NOT NULL
        )
        """,
        "CREATE INDEX events_session ON events (session_id, cursor)",
        "CREATE TABLE counters (name text PRIMARY KEY, value bigint NOT NULL)",
        "INSERT INTO counters (name, value) VALUES ('event_cursor', 0)",
        """
        CREATE TABLE snapshots (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            session_id text COLLATE "C" NOT NULL,
            kind text NOT NULL CHECK (kind IN ('turn_start', 'turn_end', 'rewind_before', 'rewind_after')),
            ref text NOT NULL,
            tree text,
            complete boolean NOT NULL,
            reason text NOT NULL DEFAULT '',
            occur_time timestamptz NOT NULL
        )
        """,
        "CREATE INDEX snapshots_session ON snapshots (session_id, seq)",
        "CREATE TABLE secrets (name text PRIMARY KEY, value bytea NOT NULL)",
    ),
    # 2: the replica directory (leases by the database's clock), and which replica owns each session.
    (
        """
        CREATE TABLE replicas (
            replica_id text COLLATE "C" PRIMARY KEY,
            address text NOT NULL,
            epoch bigint NOT NULL,
            lease_expires timestamptz NOT NULL
        )
        """,
        "ALTER TABLE sessions ADD COLUMN replica text NOT NULL DEFAULT ''",
    ),
)

# What makes a call StorageUnavailable (retryable): the server lost, refused, shut down, out of
# disk, a lock or a statement timeout, a deadlock; or a read-only server where a write was meant.
_UNAVAILABLE = (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction)

# What DeleteSession deletes or rewrites rows of; vacuumed after it commits.
_ERASED_TABLES = ("sessions", "anchors", "rewinds", "snapshots", "requests", "events")


# The channel every event append NOTIFYs on commit, which the event hub of every replica LISTENs to.
EVENTS_CHANNEL = "agent_rewind_events"


class PostgresLedger:
    """`Ledger` on a PostgreSQL database. Open with `await PostgresLedger.open(url)`."""

    def __init__(self, pool: AsyncConnectionPool[Connection], *, vacuum_full: bool = False) -> None:
        self._pool = pool
        self._vacuum_full = vacuum_full
        # The connection LISTENing for appended events (`wait_for_events`), opened on first use.
        self._conninfo = ""
        self._listener: AsyncConnection[Any] | None = None
        self._fence: tuple[str, int] | None = None  # (replica id, epoch) every write must hold

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        connection_timeout: float = 5.0,
        lock_timeout: float = 5.0,
        vacuum_full: bool = False,
        password: str | None = None,
    ) -> PostgresLedger:
        """Connects, migrates the schema to the newest version, and opens a pool of connections.

        `connection_timeout`: how long a call waits for a connection (and to connect);
        `lock_timeout`: how long a statement waits for a row another writer holds. Past either,
        StorageUnavailable. `vacuum_full`: after an erasure, VACUUM FULL the tables it touched
        instead of VACUUM (see the module's docstring). SchemaTooNew for a database written by a
        newer version; StorageUnavailable for a server that cannot be reached. Every replica
        of a deployment opens the same database (each loads only the sessions it owns)."""
        params = conninfo_to_dict(url)
        if password:  # from --database-password-file: in no URL, command line or environment
            params["password"] = password
        params.setdefault("connect_timeout", max(2, int(connection_timeout)))
        conninfo = make_conninfo("", **params)
        try:
            migrating = await AsyncConnection.connect(conninfo, autocommit=True, row_factory=dict_row)
        except psycopg.OperationalError as err:
            raise StorageUnavailable(str(err)) from err
        try:
            await _migrate(migrating)
        except psycopg.OperationalError as err:
            raise StorageUnavailable(str(err)) from err
        finally:
            await migrating.close()

        async def configure(conn: Connection) -> None:
            await conn.set_isolation_level(IsolationLevel.READ_COMMITTED)
            await conn.execute(
                "SELECT set_config('lock_timeout', %s, false),"
                " CASE WHEN current_setting('synchronous_commit') = 'off'"
                " THEN set_config('synchronous_commit', 'on', false) END",
                (f"{int(lock_timeout * 1000)}ms",),
            )

        pool = AsyncConnectionPool(
            conninfo,
            connection_class=AsyncConnection[DictRow],
            kwargs={"autocommit": True, "row_factory": dict_row},
            min_size=min_size,
            max_size=max_size,
            open=False,
            configure=configure,
            timeout=connection_timeout,
            # While the server is away, the pool tries to connect again with a growing backoff
            # (1 s, 2 s, 4 s...) for this long, then starts over from 1 s at the next call: a server
            # back after a long outage is found within seconds, not after the last long delay.
            reconnect_timeout=10.0,
            name="agent-rewind-ledger",
        )
        try:
            await pool.open(wait=True, timeout=connection_timeout)
        except BaseException as err:
            await pool.close()
            if isinstance(err, psycopg.OperationalError):
                raise StorageUnavailable(str(err)) from err
            raise
        ledger = cls(pool, vacuum_full=vacuum_full)
        ledger._conninfo = conninfo
        return ledger

    async def schema_version(self) -> int:
        rows = await self._rows("SELECT version FROM agent_rewind_schema")
        return int(rows[0]["version"])

    async def close(self) -> None:
        await self._pool.close()
        if self._listener is not None:
            with contextlib.suppress(psycopg.Error):
                await self._listener.close()
        self._listener = None

    async def wait_for_events(self, seconds: float) -> None:
        """Waits for a NOTIFY on EVENTS_CHANNEL (every append sends one on commit) on a
        connection of its own; on any trouble with it, for `seconds` (the caller polls), and the
        connection is made again at the next call."""
        try:
            if self._listener is None or self._listener.closed:
                self._listener = await AsyncConnection.connect(self._conninfo, autocommit=True)
                await self._listener.execute(f"LISTEN {EVENTS_CHANNEL}")
            async for _ in self._listener.notifies(timeout=seconds, stop_after=1):
                pass
        except psycopg.Error as err:
            log.warning("not listening for events appended elsewhere; polling", error=str(err))
            if self._listener is not None:
                with contextlib.suppress(psycopg.Error):
                    await self._listener.close()
                self._listener = None
            await asyncio.sleep(seconds)

    # Plumbing

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        """A pooled connection known to work; StorageUnavailable when none can be had (refused,
        shut down, disk full, a lock timeout: any OperationalError, from here or the block), and
        for a write refused as read-only (a standby, after a failover that DNS has not caught up
        with)."""
        try:
            conn = await self._live_connection()
            try:
                yield conn
            finally:
                await self._pool.putconn(conn)
        except _UNAVAILABLE as err:
            raise StorageUnavailable(str(err)) from err

    async def _live_connection(self) -> Connection:
        """Checks the connection out of the pool with an empty query first: one the server dropped
        (a restart, a failover, an administrator) goes back, to be closed and replaced, and the
        next is tried at once (the pool's own `check` would wait a backoff of a second or more
        between two). After as many tries as the pool may hold connections, the next one is
        taken unchecked (the pool's wait, and the statement, fail as they will)."""
        for _ in range(self._pool.max_size):
            conn = await self._pool.getconn()
            try:
                await AsyncConnectionPool.check_connection(conn)
            except psycopg.OperationalError:
                await self._pool.putconn(conn)
                continue
            except BaseException:
                await self._pool.putconn(conn)
                raise
            return conn
        return await self._pool.getconn()

    async def _write(self, work: Callable[[Connection], Awaitable[T]], *, fenced: bool = True) -> T:
        """Runs `work` in one transaction; durable when this returns. `fenced`: only while this
        replica's epoch is current (`fence`): the directory's row is read FOR SHARE, so a new
        registration waits for this transaction, and none of it commits after one."""
        started = time.perf_counter()
        try:
            async with self._connection() as conn, conn.transaction():
                if fenced and self._fence is not None:
                    replica_id, epoch = self._fence
                    cursor = await conn.execute(
                        "SELECT epoch FROM replicas WHERE replica_id = %s FOR SHARE", (replica_id,)
                    )
                    row = await cursor.fetchone()
                    if row is None or row["epoch"] != epoch:
                        raise ReplicaUnavailable(replica_id, FENCED)
                return await work(conn)
        except BaseException:
            metrics.LEDGER_WRITE_FAILURES.inc()
            raise
        finally:
            metrics.LEDGER_WRITE_SECONDS.observe(time.perf_counter() - started)

    async def _rows(self, query: str, args: Sequence[Any] = ()) -> list[DictRow]:
        async with self._connection() as conn:
            cursor = await conn.execute(query, args)
            return await cursor.fetchall()

    async def _vacuum(self, tables: Sequence[str]) -> None:
        """Best effort: drops the old versions of rows an erasure deleted or rewrote. One table at
        a time, so a table another session holds locked does not keep the others from it."""
        options = sql.SQL("(FULL)" if self._vacuum_full else "(INDEX_CLEANUP ON)")  # indexes' entries too
        for table in tables:
            try:
                async with self._connection() as conn:
                    await conn.execute(sql.SQL("VACUUM {} {}").format(options, sql.Identifier(table)))
            except Exception as err:
                log.warning("could not vacuum the ledger after an erasure", table=table, error=str(err))

    # Secrets

    async def secret(self, name: str, size: int = 32) -> bytes:
        rows = await self._rows("SELECT value FROM secrets WHERE name = %s", (name,))
        if rows:
            return bytes(rows[0]["value"])

        async def insert(db: Connection) -> bytes:
            await db.execute(
                "INSERT INTO secrets (name, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (name, os.urandom(size)),
            )
            row = await (await db.execute("SELECT value FROM secrets WHERE name = %s", (name,))).fetchone()
            assert row is not None
            return bytes(row["value"])

        return await self._write(insert)

    # Sessions

    async def add_session(self, new: NewSession, request: NewRequest | None = None) -> SessionRecord:
        stamp = now()

        async def insert(db: Connection) -> SessionRecord:
            if request is not None:
                await _insert_request(db, request, stamp)
            cursor = await db.execute(
                "INSERT INTO sessions (session_id, cwd, options, checkpointing, create_time, update_time,"
                " principal, workspace_snapshots, replica) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (session_id) DO NOTHING RETURNING *",
                (
                    new.session_id,
                    new.cwd,
                    Jsonb(new.options),
                    new.checkpointing,
                    stamp,
                    stamp,
                    new.principal,
                    new.workspace_snapshots,
                    new.replica,
                ),
            )
            row = await cursor.fetchone()
            if row is None:  # the id is taken (a tombstone's included), maybe by another replica
                raise SessionAlreadyExists(new.session_id)
            return _session(row)

        return await self._write(insert)

    # The replica directory: leases by the database's clock, so replicas' clocks need not agree.

    _REPLICA = "replica_id, address, epoch, lease_expires, lease_expires > now() AS alive"

    async def register_replica(self, replica_id: str, address: str, lease_s: float) -> ReplicaRecord:
        async def upsert(db: Connection) -> ReplicaRecord:
            cursor = await db.execute(
                "INSERT INTO replicas (replica_id, address, epoch, lease_expires)"
                " VALUES (%s, %s, 1, now() + make_interval(secs => %s))"
                " ON CONFLICT (replica_id) DO UPDATE SET address = excluded.address,"
                f" epoch = replicas.epoch + 1, lease_expires = excluded.lease_expires RETURNING {self._REPLICA}",
                (replica_id, address, lease_s),
            )
            row = await cursor.fetchone()
            assert row is not None
            return _replica(row)

        return await self._write(upsert, fenced=False)

    async def renew_replica(self, replica_id: str, epoch: int, lease_s: float) -> ReplicaRecord | None:
        async def renew(db: Connection) -> ReplicaRecord | None:
            cursor = await db.execute(
                "UPDATE replicas SET lease_expires = now() + make_interval(secs => %s)"
                f" WHERE replica_id = %s AND epoch = %s RETURNING {self._REPLICA}",
                (lease_s, replica_id, epoch),
            )
            row = await cursor.fetchone()
            return _replica(row) if row is not None else None

        return await self._write(renew, fenced=False)

    async def retire_replica(self, replica_id: str, epoch: int) -> None:
        async def retire(db: Connection) -> None:
            await db.execute(
                "UPDATE replicas SET lease_expires = now() WHERE replica_id = %s AND epoch = %s",
                (replica_id, epoch),
            )

        await self._write(retire, fenced=False)

    async def take_over(self, replica_id: str, by: str) -> list[str] | None:
        async def take(db: Connection) -> list[str] | None:
            fenced = await db.execute(
                "UPDATE replicas SET epoch = epoch + 1 WHERE replica_id = %s AND lease_expires <= now()",
                (replica_id,),
            )
            if not fenced.rowcount:
                return None
            cursor = await db.execute(
                "UPDATE sessions SET replica = %s WHERE replica = %s RETURNING session_id", (by, replica_id)
            )
            return sorted(r["session_id"] for r in await cursor.fetchall())

        return await self._write(take)

    async def replicas(self) -> list[ReplicaRecord]:
        rows = await self._rows(f"SELECT {self._REPLICA} FROM replicas ORDER BY replica_id")
        return [_replica(r) for r in rows]

    def fence(self, replica_id: str, epoch: int) -> None:
        self._fence = (replica_id, epoch)

    async def remove_session(self, session_id: str) -> None:
        async def delete(db: Connection) -> None:
            await db.execute(
                "DELETE FROM requests WHERE session_id = %s AND method = 'CreateSession'", (session_id,)
            )
            await db.execute("DELETE FROM sessions WHERE session_id = %s", (session_id,))

        await self._write(delete)

    async def session(self, session_id: str) -> SessionRecord | None:
        rows = await self._rows(
            "SELECT * FROM sessions WHERE session_id = %s AND deleted_time IS NULL", (session_id,)
        )
        return _session(rows[0]) if rows else None

    async def sessions(self) -> list[SessionRecord]:
        rows = await self._rows(
            "SELECT * FROM sessions WHERE deleted_time IS NULL ORDER BY create_time, session_id"
        )
        return [_session(r) for r in rows]

    async def claim_sessions(self, replica_id: str, *, every: bool = False) -> int:
        claimed = "replica <> %s" if every else "replica = ''"
        args = (replica_id, replica_id) if every else (replica_id,)

        async def claim(db: Connection) -> int:
            cursor = await db.execute(f"UPDATE sessions SET replica = %s WHERE {claimed}", args)
            return cursor.rowcount

        return await self._write(claim)

    async def session_counts(self) -> dict[str, int]:
        rows = await self._rows(
            "SELECT replica, COUNT(*) AS n FROM sessions WHERE deleted_time IS NULL GROUP BY replica"
        )
        return {r["replica"]: int(r["n"]) for r in rows}

    async def touch_session(
        self, session_id: str, *, closed: bool | None = None, started: bool | None = None
    ) -> datetime:
        stamp = now()

        async def touch(db: Connection) -> None:
            await db.execute(
                "UPDATE sessions SET update_time = %s, closed = COALESCE(%s, closed),"
                " started = COALESCE(%s, started) WHERE session_id = %s",
                (stamp, closed, started, session_id),
            )

        await self._write(touch)
        return stamp

    # Request ids

    async def request(self, request_id: str) -> RequestRecord | None:
        rows = await self._rows("SELECT * FROM requests WHERE request_id = %s", (request_id,))
        return _request(rows[0]) if rows else None

    async def begin_request(self, request: NewRequest, result: dict[str, Any] | None = None) -> None:
        stamp = now()

        async def insert(db: Connection) -> None:
            await _insert_request(db, request, stamp, result)

        await self._write(insert)

    async def finish_request(self, request_id: str, result: dict[str, Any]) -> None:
        async def finish(db: Connection) -> None:
            await db.execute(
                "UPDATE requests SET done = true, result = %s WHERE request_id = %s",
                (_json(result), request_id),
            )

        await self._write(finish)

    async def forget_request(self, request_id: str) -> None:
        async def delete(db: Connection) -> None:
            await db.execute("DELETE FROM requests WHERE request_id = %s", (request_id,))

        await self._write(delete)

    async def forget_requests(self, older_than: datetime) -> int:
        async def delete(db: Connection) -> int:
            cursor = await db.execute("DELETE FROM requests WHERE create_time < %s", (older_than,))
            return cursor.rowcount

        return await self._write(delete)

    # Pending conversation cuts

    async def anchor(self, session_id: str) -> Anchor | None:
        rows = await self._rows("SELECT * FROM anchors WHERE session_id = %s", (session_id,))
        if not rows:
            return None
        r = rows[0]
        return Anchor(
            r["session_id"],
            r["anchor_uuid"],
            r["target_message_id"],
            int(r["transcript_size"]),
            r["drops_turn"],
            r["rewind_id"],
        )

    async def clear_anchor(self, session_id: str, anchor_uuid: str) -> None:
        async def delete(db: Connection) -> None:
            await db.execute(
                "DELETE FROM anchors WHERE session_id = %s AND anchor_uuid = %s", (session_id, anchor_uuid)
            )

        await self._write(delete)

    # Rewinds

    async def begin_rewind(self, new: NewRewind) -> None:
        stamp = now()

        async def insert(db: Connection) -> None:
            if new.request is not None:
                await _insert_request(db, new.request, stamp, result={"rewind_id": new.rewind_id})
            await db.execute(
                "INSERT INTO rewinds (rewind_id, session_id, request_id, message_id, mode, state, plan,"
                " principal, occur_time, kind) VALUES (%s, %s, %s, %s, %s, 'pending', %s, %s, %s, %s)",
                (
                    new.rewind_id,
                    new.session_id,
                    new.request.request_id if new.request else None,
                    new.message_id,
                    new.mode,
                    Jsonb(new.plan),
                    new.principal,
                    stamp,
                    new.kind,
                ),
            )

        await self._write(insert)

    async def mark_files_applied(self, rewind_id: str) -> None:
        async def mark(db: Connection) -> None:
            await db.execute("UPDATE rewinds SET files_applied = true WHERE rewind_id = %s", (rewind_id,))

        await self._write(mark)

    async def complete_rewind(
        self, rewind_id: str, result: dict[str, Any], anchor: Anchor | None, event: NewEvent
    ) -> EventRecord:
        stamp = now()

        async def complete(db: Connection) -> EventRecord:
            # The session's row first (erase_session takes it first too), the counter last.
            await db.execute(
                "UPDATE sessions SET update_time = %s WHERE session_id = (SELECT session_id FROM rewinds"
                " WHERE rewind_id = %s AND state = 'pending')",
                (stamp, rewind_id),
            )
            row = await (
                await db.execute(
                    "UPDATE rewinds SET state = 'applied', result = %s WHERE rewind_id = %s AND state = 'pending'"
                    " RETURNING request_id",
                    (Jsonb(result), rewind_id),
                )
            ).fetchone()
            if row is None:
                raise LookupError(f"no pending rewind {rewind_id}")
            if row["request_id"] is not None:
                await db.execute(
                    "UPDATE requests SET done = true WHERE request_id = %s", (row["request_id"],)
                )
            if anchor is not None:
                await db.execute(
                    "INSERT INTO anchors (session_id, anchor_uuid, target_message_id, transcript_size,"
                    " drops_turn, rewind_id) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (session_id) DO UPDATE"
                    " SET anchor_uuid = excluded.anchor_uuid, target_message_id = excluded.target_message_id,"
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
            cursor = await _append_event(db, event, stamp, rewind_id=rewind_id)
            return _appended(cursor, event, stamp)

        return await self._write(complete)

    async def abandon_rewind(self, rewind_id: str) -> None:
        async def delete(db: Connection) -> None:
            row = await (
                await db.execute(
                    "DELETE FROM rewinds WHERE rewind_id = %s AND state = 'pending' RETURNING request_id",
                    (rewind_id,),
                )
            ).fetchone()
            if row is not None and row["request_id"] is not None:
                await db.execute("DELETE FROM requests WHERE request_id = %s", (row["request_id"],))

        await self._write(delete)

    async def rewind(self, rewind_id: str) -> RewindRecord | None:
        rows = await self._rows("SELECT * FROM rewinds WHERE rewind_id = %s", (rewind_id,))
        return _rewind(rows[0]) if rows else None

    async def pending_rewinds(self, session_id: str | None = None) -> list[RewindRecord]:
        if session_id is None:
            rows = await self._rows("SELECT * FROM rewinds WHERE state = 'pending' ORDER BY id")
        else:
            rows = await self._rows(
                "SELECT * FROM rewinds WHERE state = 'pending' AND session_id = %s ORDER BY id", (session_id,)
            )
        return [_rewind(r) for r in rows]

    async def rewinds(self, session_id: str | None = None) -> list[RewindRecord]:
        if session_id is None:
            rows = await self._rows("SELECT * FROM rewinds ORDER BY id")
        else:
            rows = await self._rows("SELECT * FROM rewinds WHERE session_id = %s ORDER BY id", (session_id,))
        return [_rewind(r) for r in rows]

    # Workspace snapshots

    async def add_snapshot(self, new: NewSnapshot) -> SnapshotRecord:
        stamp = now()

        async def insert(db: Connection) -> int:
            row = await (
                await db.execute(
                    "INSERT INTO snapshots (session_id, kind, ref, tree, complete, reason, occur_time)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING seq",
                    (new.session_id, new.kind, new.ref, new.tree, new.complete, new.reason, stamp),
                )
            ).fetchone()
            assert row is not None
            return int(row["seq"])

        seq = await self._write(insert)
        return SnapshotRecord(
            seq, new.session_id, new.kind, new.ref, new.tree, new.complete, new.reason, stamp
        )

    async def snapshots(self, session_id: str) -> list[SnapshotRecord]:
        rows = await self._rows("SELECT * FROM snapshots WHERE session_id = %s ORDER BY seq", (session_id,))
        return [_snapshot(row) for row in rows]

    async def prune_snapshots(self, session_id: str, before_seq: int) -> int:
        async def prune(db: Connection) -> int:
            cursor = await db.execute(
                "UPDATE snapshots SET tree = NULL, complete = false, reason = 'pruned'"
                " WHERE session_id = %s AND seq < %s AND tree IS NOT NULL",
                (session_id, before_seq),
            )
            return cursor.rowcount

        return await self._write(prune)

    # The event log

    async def events_after(
        self, cursor: int, session_id: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        if session_id is None:
            rows = await self._rows(
                "SELECT * FROM events WHERE cursor > %s ORDER BY cursor LIMIT %s", (cursor, limit)
            )
        else:
            rows = await self._rows(
                "SELECT * FROM events WHERE session_id = %s AND cursor > %s ORDER BY cursor LIMIT %s",
                (session_id, cursor, limit),
            )
        return [_event(r) for r in rows]

    async def event_bounds(self) -> tuple[int, int]:
        # One statement, one snapshot: the newest and the oldest agree.
        (row,) = await self._rows(
            "SELECT (SELECT value FROM counters WHERE name = 'event_cursor') AS newest,"
            " (SELECT MIN(cursor) FROM events) AS oldest"
        )
        newest = int(row["newest"])
        if newest == 0:
            return 0, 0
        return (int(row["oldest"]) if row["oldest"] is not None else newest + 1), newest

    async def trim_events(self, keep: int | None, older_than: datetime | None) -> int:
        async def trim(db: Connection) -> int:
            dropped = 0
            if older_than is not None:
                # Always a prefix of the log (a clock set back must not punch holes in it).
                cursor = await db.execute(
                    "DELETE FROM events WHERE cursor <= (SELECT MAX(cursor) FROM events WHERE occur_time < %s)",
                    (older_than,),
                )
                dropped += cursor.rowcount
            if keep is not None:
                cursor = await db.execute(
                    "DELETE FROM events WHERE cursor <= (SELECT value FROM counters WHERE name = 'event_cursor') - %s",
                    (keep,),
                )
                dropped += cursor.rowcount
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
        stamp = now()

        async def erase(db: Connection) -> EventRecord:
            live = await (
                await db.execute(
                    "SELECT 1 FROM sessions WHERE session_id = %s AND deleted_time IS NULL FOR UPDATE",
                    (session_id,),
                )
            ).fetchone()
            if live is None:
                raise LookupError(f"no session {session_id}")
            if request is not None:
                await _insert_request(db, request, stamp, result={}, done=True)
            await db.execute(
                "UPDATE sessions SET cwd = '', options = '{}', closed = true, update_time = %s,"
                " deleted_time = %s, erasure = %s WHERE session_id = %s",
                (stamp, stamp, Jsonb(erasure) if erasure is not None else None, session_id),
            )
            await db.execute("DELETE FROM anchors WHERE session_id = %s", (session_id,))
            await db.execute("DELETE FROM rewinds WHERE session_id = %s", (session_id,))
            await db.execute("DELETE FROM snapshots WHERE session_id = %s", (session_id,))
            # Every request id of the session but the delete's own, recorded above.
            await db.execute(
                "DELETE FROM requests WHERE session_id = %s AND request_id IS DISTINCT FROM %s",
                (session_id, request.request_id if request is not None else None),
            )
            # The events stay (cursors are gap-free, and watchers must learn of the deletion), but
            # the paths a rewind changed are the workspace's content: they go.
            await db.execute(
                "UPDATE events SET data = jsonb_set(data, '{files,files_changed}', '[]'::jsonb)"
                " WHERE session_id = %s AND jsonb_typeof(data #> '{files,files_changed}') = 'array'"
                " AND jsonb_array_length(data #> '{files,files_changed}') > 0",
                (session_id,),
            )
            cursor = await _append_event(db, event, stamp)
            return _appended(cursor, event, stamp)

        committed = await self._write(erase)
        await self._vacuum(_ERASED_TABLES)
        return committed

    async def tombstone(self, session_id: str) -> Tombstone | None:
        rows = await self._rows(
            "SELECT * FROM sessions WHERE session_id = %s AND deleted_time IS NOT NULL", (session_id,)
        )
        return _tombstone(rows[0]) if rows else None

    async def unfinished_erasures(self) -> list[Tombstone]:
        rows = await self._rows(
            "SELECT * FROM sessions WHERE deleted_time IS NOT NULL AND erasure IS NOT NULL"
            " ORDER BY deleted_time, session_id"
        )
        return [_tombstone(r) for r in rows]

    async def finish_erasure(self, session_id: str) -> None:
        async def finish(db: Connection) -> int:
            cursor = await db.execute(
                "UPDATE sessions SET erasure = NULL WHERE session_id = %s AND deleted_time IS NOT NULL"
                " AND erasure IS NOT NULL",
                (session_id,),
            )
            return cursor.rowcount

        if await self._write(finish):
            await self._vacuum(("sessions",))


async def _migrate(db: Connection) -> None:
    """Brings the schema to the newest version, one version per transaction, each under the
    advisory lock (another replica may be migrating too: the version is read again under it)."""
    while True:
        async with db.transaction():
            await db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            await db.execute("CREATE TABLE IF NOT EXISTS agent_rewind_schema (version integer NOT NULL)")
            row = await (await db.execute("SELECT version FROM agent_rewind_schema")).fetchone()
            version = int(row["version"]) if row is not None else 0
            if version > len(MIGRATIONS):
                # Raised inside the transaction: it rolls back, and nothing was touched.
                raise SchemaTooNew(version, len(MIGRATIONS))
            if version == len(MIGRATIONS):
                return
            for statement in MIGRATIONS[version]:
                await db.execute(statement)
            if row is None:
                await db.execute("INSERT INTO agent_rewind_schema (version) VALUES (%s)", (version + 1,))
            else:
                await db.execute("UPDATE agent_rewind_schema SET version = %s", (version + 1,))
            log.info("ledger schema migrated", version=version + 1)


def _time(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _json(value: Any) -> Json:
    return Json(value, dumps=dumps)


def _session(row: DictRow) -> SessionRecord:
    return SessionRecord(
        session_id=row["session_id"],
        cwd=row["cwd"],
        options=row["options"],
        checkpointing=row["checkpointing"],
        create_time=_time(row["create_time"]),
        update_time=_time(row["update_time"]),
        closed=row["closed"],
        started=row["started"],
        principal=row["principal"],
        workspace_snapshots=row["workspace_snapshots"],
        replica=row["replica"],
    )


def _replica(row: DictRow) -> ReplicaRecord:
    return ReplicaRecord(
        replica_id=row["replica_id"],
        address=row["address"],
        epoch=row["epoch"],
        lease_expires=_time(row["lease_expires"]),
        alive=row["alive"],
    )


def _rewind(row: DictRow) -> RewindRecord:
    return RewindRecord(
        rewind_id=row["rewind_id"],
        session_id=row["session_id"],
        request_id=row["request_id"],
        message_id=row["message_id"],
        mode=row["mode"],
        state=row["state"],
        files_applied=row["files_applied"],
        plan=row["plan"],
        result=row["result"],
        principal=row["principal"],
        occur_time=_time(row["occur_time"]),
        kind=row["kind"],
        cursor=row["cursor"],
    )


def _tombstone(row: DictRow) -> Tombstone:
    return Tombstone(
        session_id=row["session_id"],
        principal=row["principal"],
        create_time=_time(row["create_time"]),
        deleted_time=_time(row["deleted_time"]),
        erasure=row["erasure"],
        replica=row["replica"],
    )


def _snapshot(row: DictRow) -> SnapshotRecord:
    return SnapshotRecord(
        seq=int(row["seq"]),
        session_id=row["session_id"],
        kind=row["kind"],
        ref=row["ref"],
        tree=row["tree"],
        complete=row["complete"],
        reason=row["reason"],
        occur_time=_time(row["occur_time"]),
    )


def _request(row: DictRow) -> RequestRecord:
    return RequestRecord(
        request_id=row["request_id"],
        method=row["method"],
        fingerprint=row["fingerprint"],
        session_id=row["session_id"],
        done=row["done"],
        result=row["result"],
        create_time=_time(row["create_time"]),
    )


async def _insert_request(
    db: Connection,
    request: NewRequest,
    stamp: datetime,
    result: dict[str, Any] | None = None,
    *,
    done: bool = False,
) -> None:
    """Records a request id, or raises RequestIdTaken with the record that has it. A concurrent
    insert of the same id is waited for: its row is then found, or, rolled back, this one goes in."""
    while True:
        inserted = await (
            await db.execute(
                "INSERT INTO requests (request_id, method, fingerprint, session_id, done, result, create_time)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (request_id) DO NOTHING RETURNING 1",
                (
                    request.request_id,
                    request.method,
                    request.fingerprint,
                    request.session_id,
                    done,
                    _json(result) if result is not None else None,
                    stamp,
                ),
            )
        ).fetchone()
        if inserted is not None:
            return
        existing = await (
            await db.execute("SELECT * FROM requests WHERE request_id = %s", (request.request_id,))
        ).fetchone()
        if existing is not None:
            raise RequestIdTaken(_request(existing))
        # Deleted between the two statements (forgotten by another replica): try again.


async def _append_event(
    db: Connection, event: NewEvent, stamp: datetime, *, rewind_id: str | None = None
) -> int:
    """Appends `event` under the next cursor (and records it on rewind `rewind_id`, a row this
    transaction has locked already), in one statement: the counter row's lock, taken here and
    held until the transaction ends, is held for as few round trips as can be."""
    row = await (
        await db.execute(
            "WITH next AS (UPDATE counters SET value = value + 1 WHERE name = 'event_cursor' RETURNING value),"
            " appended AS (INSERT INTO events (cursor, kind, session_id, rewind_id, principal, occur_time, data)"
            " SELECT value, %s, %s, %s, %s, %s, %s FROM next RETURNING cursor),"
            " recorded AS (UPDATE rewinds SET cursor = (SELECT cursor FROM appended) WHERE rewind_id = %s)"
            # Listeners on other replicas are told on commit (never before: NOTIFY is transactional).
            f" SELECT cursor, pg_notify('{EVENTS_CHANNEL}', cursor::text) FROM appended",
            (
                event.kind,
                event.session_id,
                event.rewind_id,
                event.principal,
                stamp,
                Jsonb(event.data),
                rewind_id,
            ),
        )
    ).fetchone()
    assert row is not None
    return int(row["cursor"])


def _appended(cursor: int, event: NewEvent, stamp: datetime) -> EventRecord:
    return EventRecord(
        cursor, event.kind, event.session_id, event.rewind_id, event.principal, stamp, dict(event.data)
    )


def _event(row: DictRow) -> EventRecord:
    return EventRecord(
        cursor=int(row["cursor"]),
        kind=row["kind"],
        session_id=row["session_id"],
        rewind_id=row["rewind_id"],
        principal=row["principal"],
        occur_time=_time(row["occur_time"]),
        data=row["data"],
    )


if TYPE_CHECKING:

    def _is_a_ledger(ledger: PostgresLedger) -> Ledger:
        return ledger
