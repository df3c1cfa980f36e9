"""The ledger on PostgreSQL, for several replicas of the service sharing one database.

`PostgresDialect`, the database as the stores of `store/sql/` use it, and `PostgresLedger`, those
stores over it: the same observable behaviour as `store/sqlite.py`, with what a server shared by
several writers asks for:

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
- The stores' statements are spelled with `%s` placeholders and the JSON columns' own names
  (`PostgresDialect.SPELLING`); where a statement differs altogether (an event's append, blanking
  an erased session's file paths) the text is this module's.
- The replica directory's leases are by the database's clock, so replicas' clocks need not agree;
  a fenced write reads the directory's row FOR SHARE, so a new registration waits for it.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import structlog
from psycopg import AsyncConnection, IsolationLevel, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Json, Jsonb
from psycopg_pool import AsyncConnectionPool

from agent_rewind.errors import StorageUnavailable
from agent_rewind.store.dialect import Dialect, Result, Row, Spelling, Work
from agent_rewind.store.records import NewEvent, NewRequest, SchemaTooNew, dumps
from agent_rewind.store.sql.ledger import SqlLedger

T = TypeVar("T")
Connection = AsyncConnection[DictRow]

log = structlog.get_logger(__name__)

__all__ = ["MIGRATIONS", "PostgresDialect", "PostgresLedger", "SchemaTooNew"]

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
    # 3: where a fork came from; the hosts each turn's commands reached.
    (
        "ALTER TABLE sessions ADD COLUMN forked_from_session text NOT NULL DEFAULT ''",
        "ALTER TABLE sessions ADD COLUMN forked_from_message text NOT NULL DEFAULT ''",
        """
        CREATE TABLE egress (
            seq bigserial PRIMARY KEY,
            session_id text COLLATE "C" NOT NULL,
            prompt_id text COLLATE "C" NOT NULL,
            host text NOT NULL,
            port integer NOT NULL,
            UNIQUE (session_id, prompt_id, host, port)
        )
        """,
    ),
    # 4: webhook delivery: each URL's cursor and lease (webhooks/), and the events it gave up on.
    (
        """
        CREATE TABLE webhooks (
            url text COLLATE "C" PRIMARY KEY,
            cursor bigint NOT NULL,
            holder text NOT NULL DEFAULT '',
            lease_epoch bigint NOT NULL DEFAULT 0,
            lease_expires timestamptz NOT NULL,
            delivered bigint NOT NULL DEFAULT 0,
            failed bigint NOT NULL DEFAULT 0,
            last_error text NOT NULL DEFAULT '',
            update_time timestamptz NOT NULL
        )
        """,
        """
        CREATE TABLE webhook_failures (
            url text COLLATE "C" NOT NULL,
            cursor bigint NOT NULL,
            attempts integer NOT NULL,
            error text NOT NULL,
            occur_time timestamptz NOT NULL,
            PRIMARY KEY (url, cursor)
        )
        """,
    ),
    # 5: the points index: each session's visible rewind points (store/sql/point_index.py, PointIndex).
    (
        """
        CREATE TABLE point_heads (
            session_id text COLLATE "C" PRIMARY KEY,
            covered bigint NOT NULL,
            digest text NOT NULL,
            leaf text NOT NULL,
            seed text NOT NULL,
            points_count integer NOT NULL,
            last_message_id text NOT NULL,
            snapshot_count integer NOT NULL,
            leaf_compactions integer NOT NULL,
            holds_newest boolean NOT NULL,
            cut text NOT NULL
        )
        """,
        """
        CREATE TABLE points (
            session_id text COLLATE "C" NOT NULL,
            idx integer NOT NULL,
            uuid text NOT NULL,
            message_id text NOT NULL,
            resume_at_message_id text NOT NULL,
            anchor text NOT NULL,
            preview text NOT NULL,
            create_time timestamptz,
            snapshot_pos integer,
            compactions integer NOT NULL,
            is_copy boolean NOT NULL,
            PRIMARY KEY (session_id, idx)
        )
        """,
        "CREATE INDEX points_uuid ON points (session_id, uuid)",
    ),
    # 9: what each session holds, and how far retention pruned it (store/sql/storage.py).
    (
        """
        CREATE TABLE session_storage (
            session_id text COLLATE "C" PRIMARY KEY,
            principal text NOT NULL,
            workspace_bytes bigint NOT NULL,
            history_bytes bigint NOT NULL,
            measure_time timestamptz,
            files_pruned_before timestamptz
        )
        """,
        "CREATE INDEX session_storage_principal ON session_storage (principal)",
    ),
    # 10: a page of points reads its own start snapshots and the newest unusable one, never the
    # session's whole history (store/sql/snapshot_order.py `snapshots_served`).
    (
        "CREATE INDEX snapshots_ref ON snapshots (session_id, ref)",
        "CREATE INDEX snapshots_unusable ON snapshots (session_id, seq) WHERE complete = false OR tree IS NULL",
    ),
)

# What makes a call StorageUnavailable (retryable): the server lost, refused, shut down, out of
# disk, a lock or a statement timeout, a deadlock; or a read-only server where a write was meant.
_UNAVAILABLE = (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction)


# The channel every event append NOTIFYs on commit, which the event hub of every replica LISTENs to.
EVENTS_CHANNEL = "agent_rewind_events"

# An event's append, in one statement: the counter row's lock, taken here and held until the
# transaction ends, is held for as few round trips as can be.
_APPEND_EVENT = (
    "WITH next AS (UPDATE counters SET value = value + 1 WHERE name = 'event_cursor' RETURNING value),"
    " appended AS (INSERT INTO events (cursor, kind, session_id, rewind_id, principal, occur_time, data)"
    " SELECT value, %s, %s, %s, %s, %s, %s FROM next RETURNING cursor),"
    " recorded AS (UPDATE rewinds SET cursor = (SELECT cursor FROM appended) WHERE rewind_id = %s)"
    # Listeners on other replicas are told on commit (never before: NOTIFY is transactional).
    f" SELECT cursor, pg_notify('{EVENTS_CHANNEL}', cursor::text) FROM appended"
)


class PostgresDialect(Dialect):
    """The PostgreSQL database the ledger lives in: its pool of connections, its transactions and
    spelling, and the connection that listens for appended events."""

    SPELLING = Spelling(
        p="%s",
        share=" FOR SHARE",
        lock=" FOR UPDATE",
        clock="now()",  # the database's clock, so replicas' clocks need not agree
        lease_end="now() + make_interval(secs => %s)",
        options="options",
        plan="plan",
        result="result",
        data="data",
        erasure="erasure",
    )
    SCHEMA_VERSION = "SELECT version FROM agent_rewind_schema"
    # (jsonb_set's create_missing false: a key an event does not have is not added.)
    BLANK_FILES = (
        "UPDATE events SET data = jsonb_set(jsonb_set(data, '{files,files_changed}', '[]'::jsonb, false),"
        " '{paths}', '[]'::jsonb, false)"
        " WHERE session_id = %s AND ("
        "(jsonb_typeof(data #> '{files,files_changed}') = 'array'"
        " AND jsonb_array_length(data #> '{files,files_changed}') > 0)"
        " OR (jsonb_typeof(data -> 'paths') = 'array' AND jsonb_array_length(data -> 'paths') > 0))"
    )

    def __init__(
        self, pool: AsyncConnectionPool[Connection], conninfo: str, *, vacuum_full: bool = False
    ) -> None:
        self._pool = pool
        self._vacuum_full = vacuum_full
        # The connection LISTENing for appended events (`wait_for_events`), opened on first use.
        self._conninfo = conninfo
        self._listener: AsyncConnection[Any] | None = None

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

    # Connections

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        """A pooled connection known to work. What fails to give one (refused, shut down, disk
        full, a lock timeout: an OperationalError) the stores map to StorageUnavailable, as they
        do a write refused as read-only (a standby, after a failover that DNS has not caught
        up with)."""
        conn = await self._live_connection()
        try:
            yield conn
        finally:
            await self._pool.putconn(conn)

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

    async def _write(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """Runs `work` in one transaction; durable when this returns."""
        async with self._connection() as conn, conn.transaction():
            return await work(conn)

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

    # The dialect

    async def transact(self, work: Callable[[], Work[T]], durable: bool) -> T:
        # Durable whatever `durable` says: the server can lose a commit it did not flush (a
        # crash, a failover) while this replica lives on, its points head in memory ahead of the
        # ledger's, and the next write of the index would be a difference from rows that are not
        # there. (SQLite loses one only with the machine, so with the process: see sqlite.py.)
        return await self._write(lambda conn: _run(conn, work()))

    async def read(self, statement: str, args: tuple[Any, ...]) -> Sequence[Row]:
        async with self._connection() as conn:
            return await (await conn.execute(statement, args)).fetchall()

    def unavailable(self, err: BaseException) -> bool:
        return isinstance(err, _UNAVAILABLE)

    def encode_time(self, value: datetime) -> datetime:
        return value

    def decode_time(self, value: Any) -> datetime:
        moment: datetime = value
        return moment.astimezone(UTC)

    def encode_json(self, value: Any, *, text: bool = False) -> Json | Jsonb | None:
        if value is None:
            return None
        return Json(value, dumps=dumps) if text else Jsonb(value)

    def decode_json(self, value: Any) -> Any:
        return value

    def clock_args(self) -> tuple[Any, ...]:
        return ()

    def lease_args(self, seconds: float) -> tuple[Any, ...]:
        return (seconds,)

    def legacy_columns(self, table: str, request: NewRequest | None) -> dict[str, Any]:
        return {}

    def append_event(self, event: NewEvent, stamp: datetime, rewind_id: str | None) -> Work[int]:
        args = (
            event.kind,
            event.session_id,
            event.rewind_id,
            event.principal,
            stamp,
            Jsonb(event.data),
            rewind_id,
        )
        row = (yield _APPEND_EVENT, args).one()
        assert row is not None
        return int(row["cursor"])

    async def erased(self, tables: Sequence[str], changed: bool) -> None:
        if changed:
            await self._vacuum(tables)


class PostgresLedger(SqlLedger):
    """`Ledger` on a PostgreSQL database. Open with `await PostgresLedger.open(url)`."""

    dialect: PostgresDialect

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
        return cls(PostgresDialect(pool, conninfo, vacuum_full=vacuum_full))


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


async def _run(conn: Connection, work: Work[T]) -> T:
    """Runs a write's statements on `conn`, each one's result sent back into `work`."""
    try:
        statement, args = next(work)
        while True:
            cursor = await conn.execute(statement, args)
            rows = await cursor.fetchall() if cursor.description else []
            statement, args = work.send(Result(rows, cursor.rowcount))
    except StopIteration as done:
        answer: T = done.value
        return answer
    finally:
        work.close()
