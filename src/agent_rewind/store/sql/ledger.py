"""`SqlLedger`: the stores of `store/sql/`, one per concern, composed over one dialect into a
`Ledger`. Each of its methods is its store's (`_Via`); what it holds of its own is the
deployment's secret and what the dialect answers for the whole database."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from agent_rewind.store.dialect import Dialect, Work
from agent_rewind.store.sql.database import Database
from agent_rewind.store.sql.erasure import SqlErasure
from agent_rewind.store.sql.event_log import SqlEventLog
from agent_rewind.store.sql.point_index import SqlPointIndex
from agent_rewind.store.sql.replica_directory import Fence, SqlReplicaDirectory
from agent_rewind.store.sql.request_ids import SqlRequests
from agent_rewind.store.sql.rewinds import SqlRewinds
from agent_rewind.store.sql.sessions import SqlEgress, SqlSessions
from agent_rewind.store.sql.snapshot_order import SqlSnapshotOrder
from agent_rewind.store.sql.storage import SqlStorageBook
from agent_rewind.store.sql.webhook_cursors import SqlWebhookCursors

if TYPE_CHECKING:
    from agent_rewind.store.ledger import Ledger

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


class _Via(Generic[S, P, R]):
    """A method of the ledger that is `method` of the store held in `part`: the store's own bound
    method, typed as it is (so mypy checks `SqlLedger` against `Ledger`)."""

    def __init__(self, part: str, method: Callable[Concatenate[S, P], R]) -> None:
        self._part, self._name = part, method.__name__

    @overload
    def __get__(self, ledger: None, owner: type[Any]) -> _Via[S, P, R]: ...

    @overload
    def __get__(self, ledger: SqlLedger, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, ledger: SqlLedger | None, owner: type[Any]) -> Any:
        if ledger is None:
            return self
        return getattr(getattr(ledger, self._part), self._name)


class SqlLedger:
    """`Ledger` over SQL: every method its concern's store's, each store over `dialect`."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        fence = Fence(dialect.SPELLING)
        self._db = db = Database(dialect, fence.check)
        self._requests = requests = SqlRequests(db)
        self._events = events = SqlEventLog(db)
        self._points = points = SqlPointIndex(db)
        self._sessions = SqlSessions(db, requests)
        self._egress = SqlEgress(db)
        self._rewinds = SqlRewinds(db, requests, points, events)
        self._replicas = SqlReplicaDirectory(db, fence)
        self._snapshots = SqlSnapshotOrder(db)
        self._storage = SqlStorageBook(db)
        self._erasure = SqlErasure(db, requests, events)
        self._webhooks = SqlWebhookCursors(db)
        p = dialect.SPELLING.p
        self._secret = f"SELECT value FROM secrets WHERE name = {p}"
        self._add_secret = f"INSERT INTO secrets (name, value) VALUES ({p}, {p}) ON CONFLICT DO NOTHING"

    async def close(self) -> None:
        await self.dialect.close()

    async def schema_version(self) -> int:
        row = await self._db.row(self.dialect.SCHEMA_VERSION)
        assert row is not None
        return int(row["version"])

    async def secret(self, name: str, size: int = 32) -> bytes:
        row = await self._db.row(self._secret, name)
        if row is not None:
            return bytes(row["value"])

        def insert() -> Work[bytes]:
            yield self._add_secret, (name, os.urandom(size))
            made = (yield self._secret, (name,)).one()
            assert made is not None
            return bytes(made["value"])

        return await self._db.transaction(insert)

    # Sessions
    add_session = _Via("_sessions", SqlSessions.add_session)
    remove_session = _Via("_sessions", SqlSessions.remove_session)
    session = _Via("_sessions", SqlSessions.session)
    sessions = _Via("_sessions", SqlSessions.sessions)
    touch_session = _Via("_sessions", SqlSessions.touch_session)
    claim_sessions = _Via("_sessions", SqlSessions.claim_sessions)
    session_counts = _Via("_sessions", SqlSessions.session_counts)

    # Egress
    record_egress = _Via("_egress", SqlEgress.record_egress)
    egress = _Via("_egress", SqlEgress.egress)

    # Requests
    request = _Via("_requests", SqlRequests.request)
    begin_request = _Via("_requests", SqlRequests.begin_request)
    finish_request = _Via("_requests", SqlRequests.finish_request)
    forget_request = _Via("_requests", SqlRequests.forget_request)
    forget_requests = _Via("_requests", SqlRequests.forget_requests)

    # Rewinds, and Cuts
    begin_rewind = _Via("_rewinds", SqlRewinds.begin_rewind)
    mark_files_applied = _Via("_rewinds", SqlRewinds.mark_files_applied)
    complete_rewind = _Via("_rewinds", SqlRewinds.complete_rewind)
    abandon_rewind = _Via("_rewinds", SqlRewinds.abandon_rewind)
    rewind = _Via("_rewinds", SqlRewinds.rewind)
    pending_rewinds = _Via("_rewinds", SqlRewinds.pending_rewinds)
    rewinds = _Via("_rewinds", SqlRewinds.rewinds)
    anchor = _Via("_rewinds", SqlRewinds.anchor)
    clear_anchor = _Via("_rewinds", SqlRewinds.clear_anchor)

    # PointIndex
    points_head = _Via("_points", SqlPointIndex.points_head)
    points_page = _Via("_points", SqlPointIndex.points_page)
    point_uuid = _Via("_points", SqlPointIndex.point_uuid)
    record_points = _Via("_points", SqlPointIndex.record_points)

    # ReplicaDirectory
    register_replica = _Via("_replicas", SqlReplicaDirectory.register_replica)
    renew_replica = _Via("_replicas", SqlReplicaDirectory.renew_replica)
    retire_replica = _Via("_replicas", SqlReplicaDirectory.retire_replica)
    replicas = _Via("_replicas", SqlReplicaDirectory.replicas)
    take_over = _Via("_replicas", SqlReplicaDirectory.take_over)
    fence = _Via("_replicas", SqlReplicaDirectory.fence)

    # SnapshotOrder
    add_snapshot = _Via("_snapshots", SqlSnapshotOrder.add_snapshot)
    snapshots = _Via("_snapshots", SqlSnapshotOrder.snapshots)
    prune_snapshots = _Via("_snapshots", SqlSnapshotOrder.prune_snapshots)
    newest_snapshot = _Via("_snapshots", SqlSnapshotOrder.newest_snapshot)
    snapshots_served = _Via("_snapshots", SqlSnapshotOrder.snapshots_served)

    # StorageBook
    record_usage = _Via("_storage", SqlStorageBook.record_usage)
    usage = _Via("_storage", SqlStorageBook.usage)
    principal_usage = _Via("_storage", SqlStorageBook.principal_usage)
    usage_totals = _Via("_storage", SqlStorageBook.usage_totals)
    mark_files_pruned = _Via("_storage", SqlStorageBook.mark_files_pruned)

    # EventLog
    events_after = _Via("_events", SqlEventLog.events_after)
    event_bounds = _Via("_events", SqlEventLog.event_bounds)
    trim_events = _Via("_events", SqlEventLog.trim_events)
    wait_for_events = _Via("_events", SqlEventLog.wait_for_events)

    # Erasure
    erase_session = _Via("_erasure", SqlErasure.erase_session)
    tombstone = _Via("_erasure", SqlErasure.tombstone)
    unfinished_erasures = _Via("_erasure", SqlErasure.unfinished_erasures)
    finish_erasure = _Via("_erasure", SqlErasure.finish_erasure)

    # WebhookCursors
    claim_webhook = _Via("_webhooks", SqlWebhookCursors.claim_webhook)
    renew_webhook = _Via("_webhooks", SqlWebhookCursors.renew_webhook)
    advance_webhook = _Via("_webhooks", SqlWebhookCursors.advance_webhook)
    advance_webhooks = _Via("_webhooks", SqlWebhookCursors.advance_webhooks)
    release_webhook = _Via("_webhooks", SqlWebhookCursors.release_webhook)
    webhooks = _Via("_webhooks", SqlWebhookCursors.webhooks)
    webhook_failures = _Via("_webhooks", SqlWebhookCursors.webhook_failures)


if TYPE_CHECKING:

    def _is_a_ledger(ledger: SqlLedger) -> Ledger:
        return ledger
