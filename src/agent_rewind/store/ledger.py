"""The ledger: what the service must remember that the CLI's transcripts cannot tell it.

Each session's creation parameters (reused verbatim on every rebuild of its CLI process), the
pending conversation cut of a rewind until a new turn makes it visible in the transcript
(SDK-FACTS: the SDK's cut is not durable on its own), every rewind with its intent (written
before anything is applied), the request ids that make calls idempotent, and the event log
watchers follow.

This module is the interface, in domain terms: `Ledger`, the union of one part per concern
(`Sessions`, `Requests`, `Cuts`, `PointIndex`, `Rewinds`, `ReplicaDirectory`, `SnapshotOrder`,
`EventLog`, `Erasure`, `Egress`, `WebhookCursors`), so a consumer may name only the part it uses;
the records it takes and returns are `store/records.py`'s, named here too. It has two
implementations, both `store/sql/`'s stores, one per concern, over a dialect: `store/sqlite.py`,
the embedded one, and `store/postgres.py`, the one a deployment of several replicas shares
(`--database-url`). Every write is one transaction and durable when its call returns. Methods are
coroutines so an implementation may talk to a database server without blocking the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from agent_rewind.store.records import (
    FENCED,
    Anchor,
    EgressRecord,
    EventRecord,
    ForkOrigin,
    NewEvent,
    NewRequest,
    NewRewind,
    NewSession,
    NewSnapshot,
    PointRow,
    PointsHead,
    PointsUpdate,
    ReplicaRecord,
    RequestIdTaken,
    RequestRecord,
    RewindRecord,
    SchemaTooNew,
    SessionRecord,
    SnapshotRecord,
    StorageRecord,
    Tombstone,
    WebhookFailure,
    WebhookLease,
    WebhookMove,
    WebhookRecord,
    dumps,
    now,
)

__all__ = [
    "FENCED",
    "Anchor",
    "Cuts",
    "Egress",
    "EgressRecord",
    "Erasure",
    "EventLog",
    "EventRecord",
    "ForkOrigin",
    "Ledger",
    "NewEvent",
    "NewRequest",
    "NewRewind",
    "NewSession",
    "NewSnapshot",
    "PointIndex",
    "PointRow",
    "PointsHead",
    "PointsUpdate",
    "ReplicaDirectory",
    "ReplicaRecord",
    "RequestIdTaken",
    "RequestRecord",
    "Requests",
    "RewindRecord",
    "Rewinds",
    "SchemaTooNew",
    "SessionRecord",
    "Sessions",
    "SnapshotOrder",
    "SnapshotRecord",
    "StorageBook",
    "StorageRecord",
    "Tombstone",
    "WebhookCursors",
    "WebhookFailure",
    "WebhookLease",
    "WebhookMove",
    "WebhookRecord",
    "dumps",
    "now",
]


class Sessions(Protocol):
    """Each session's creation parameters, its flags, and the replica that owns it."""

    async def add_session(self, new: NewSession, request: NewRequest | None = None) -> SessionRecord:
        """Records a session (and the request that created it). RequestIdTaken if the request
        id is taken, SessionAlreadyExists if the session id is (by a deleted session's tombstone
        too); nothing is written then."""
        ...

    async def remove_session(self, session_id: str) -> None:
        """Forgets a session whose creation failed before it was used (and its request)."""
        ...

    async def session(self, session_id: str) -> SessionRecord | None: ...

    async def sessions(self) -> list[SessionRecord]:
        """Every session, oldest first."""
        ...

    async def touch_session(
        self, session_id: str, *, closed: bool | None = None, started: bool | None = None
    ) -> datetime:
        """Sets update_time (and the flags given); returns the new update_time."""
        ...

    async def claim_sessions(self, replica_id: str, *, every: bool = False) -> int:
        """Makes `replica_id` the owner of every session (deleted ones too) that names none: those
        created before replicas were recorded, by the deployment's only server. `every`: of every
        session not already its own (an embedded ledger, which one server uses, whatever its id
        was when it made them). Returns how many."""
        ...

    async def session_counts(self) -> dict[str, int]:
        """How many sessions (not deleted) each replica owns."""
        ...


class Requests(Protocol):
    """The request ids that make calls idempotent."""

    async def request(self, request_id: str) -> RequestRecord | None: ...

    async def begin_request(self, request: NewRequest, result: dict[str, Any] | None = None) -> None:
        """Records a call before it runs (with what is known of its result so far).
        RequestIdTaken if the id is recorded already."""
        ...

    async def finish_request(self, request_id: str, result: dict[str, Any]) -> None: ...

    async def forget_request(self, request_id: str) -> None: ...

    async def forget_requests(self, older_than: datetime) -> int:
        """Drops request ids recorded before `older_than` (the retention); how many."""
        ...


class Cuts(Protocol):
    """Pending conversation cuts: a rewind's cut until the transcript shows it."""

    async def anchor(self, session_id: str) -> Anchor | None: ...

    async def clear_anchor(self, session_id: str, anchor_uuid: str) -> None:
        """Forgets a cut once the transcript shows it; a newer cut is left alone."""
        ...


class PointIndex(Protocol):
    """Each session's visible rewind points, kept as the conversation changes (written in the
    transactions that record a turn and a rewind), so any replica serves them without reading
    the transcript."""

    async def points_head(self, session_id: str) -> PointsHead | None:
        """The session's index head; None when it has none (yet)."""
        ...

    async def points_page(
        self, session_id: str, start: int, size: int
    ) -> tuple[PointsHead, list[PointRow]] | None:
        """The head and the rows `start` to `start + size`, read together (one snapshot)."""
        ...

    async def point_uuid(self, session_id: str, idx: int) -> str | None:
        """The uuid of the point at `idx`, if the index has one there."""
        ...

    async def record_points(
        self, update: PointsUpdate, *, touch: bool = False, durable: bool = True
    ) -> datetime | None:
        """Applies `update` in one transaction (with `touch`, also sets the session's update_time,
        which it returns). Not `durable`: the catch-up of a read, which a crash may lose (the
        next read after a start repairs it from the transcript's tail): committed without
        waiting for the disk where the ledger can lose it only with this process (SQLite)."""
        ...


class Rewinds(Protocol):
    """Rewinds and their intents, recorded before anything is applied."""

    async def begin_rewind(self, new: NewRewind) -> None:
        """Records the intent (and its request) before anything is applied."""
        ...

    async def mark_files_applied(self, rewind_id: str) -> None: ...

    async def complete_rewind(
        self,
        rewind_id: str,
        result: dict[str, Any],
        anchor: Anchor | None,
        event: NewEvent,
        points: PointsUpdate | None = None,
    ) -> EventRecord:
        """Marks the rewind applied, stores its cut (a conversation half), the points index as
        the cut leaves it, and appends its event, in one transaction; returns the event, with its
        cursor."""
        ...

    async def abandon_rewind(self, rewind_id: str) -> None:
        """Drops an intent of which nothing was applied (and its request, so a retry plans anew)."""
        ...

    async def rewind(self, rewind_id: str) -> RewindRecord | None: ...

    async def pending_rewinds(self, session_id: str | None = None) -> list[RewindRecord]: ...

    async def rewinds(self, session_id: str | None = None) -> list[RewindRecord]: ...


class ReplicaDirectory(Protocol):
    """The replicas of a deployment, their leases, and the fencing of this one's writes."""

    async def register_replica(self, replica_id: str, address: str, lease_s: float) -> ReplicaRecord:
        """Enters (or re-enters) a replica with a lease of `lease_s` seconds and a new epoch: an
        older incarnation of the same replica can no longer renew."""
        ...

    async def renew_replica(self, replica_id: str, epoch: int, lease_s: float) -> ReplicaRecord | None:
        """Extends the lease of the incarnation `epoch`; None when another incarnation has
        registered since (this one is fenced off)."""
        ...

    async def retire_replica(self, replica_id: str, epoch: int) -> None:
        """Ends the lease of the incarnation `epoch` now (a clean shutdown)."""
        ...

    async def replicas(self) -> list[ReplicaRecord]:
        """Every replica ever registered, by id, each saying whether its lease is current."""
        ...

    async def take_over(self, replica_id: str, by: str) -> list[str] | None:
        """If `replica_id`'s lease has run out: fences it off (a new epoch, so none of its writes
        commits any more, nor its renewals) and makes `by` the owner of every session it owned
        (deleted ones too, whose erasure `by` finishes), in one transaction. Returns those
        sessions' ids; None, changing nothing, when its lease is current (it came back)."""
        ...

    def fence(self, replica_id: str, epoch: int) -> None:
        """From now on every write commits only while `epoch` is the directory's epoch of
        `replica_id`: once another incarnation has registered under that id, each write raises
        ReplicaUnavailable and changes nothing (the directory's own writes excepted)."""
        ...


class StorageBook(Protocol):
    """What each session holds on the server's volumes as last measured, summed per principal
    across replicas (the limits read it), and how far retention has pruned its files history."""

    async def record_usage(
        self, session_id: str, principal: str, workspace_bytes: int, history_bytes: int
    ) -> None: ...

    async def usage(self, session_id: str) -> StorageRecord | None: ...

    async def principal_usage(self, principal: str) -> int:
        """Bytes the principal's sessions hold together, as last measured (0: none measured)."""
        ...

    async def usage_totals(self) -> tuple[int, int, int]:
        """Workspace bytes, history bytes and sessions measured, over every session."""
        ...

    async def mark_files_pruned(self, session_id: str, principal: str, before: datetime) -> None:
        """Points sent before `before` no longer have what a files rewind needs. Only ever moves
        later."""
        ...


class SnapshotOrder(Protocol):
    """The order a session's workspace snapshots were taken in."""

    async def add_snapshot(self, new: NewSnapshot) -> SnapshotRecord: ...

    async def snapshots(self, session_id: str) -> list[SnapshotRecord]:
        """The session's snapshots, in the order they were taken."""
        ...

    async def newest_snapshot(self, session_id: str) -> int:
        """The seq of the session's newest snapshot record (0: none). One index entry read."""
        ...

    async def snapshots_served(self, session_id: str, refs: Sequence[str]) -> dict[str, bool]:
        """For each of `refs` (prompt ids) whose turn started with a snapshot: whether snapshots
        can serve a files rewind to it (its newest start snapshot, and every later snapshot of
        the session, complete). What `Snapshots.available` says of all records, for a page of
        points only: it reads their start records and one index entry, whatever the session's
        length."""
        ...

    async def prune_snapshots(self, session_id: str, before_seq: int) -> int:
        """Marks the session's snapshots older than `before_seq` pruned (no tree, reason
        "pruned"): their trees may then be collected. How many."""
        ...


class EventLog(Protocol):
    """The event log watchers follow."""

    async def events_after(
        self, cursor: int, session_id: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        """Events with a cursor above `cursor`, oldest first (of one session, if given)."""
        ...

    async def event_bounds(self) -> tuple[int, int]:
        """(the oldest retained cursor, the newest cursor); (0, 0) before the first event. After
        a trim that kept nothing, the oldest is the newest + 1."""
        ...

    async def trim_events(self, keep: int | None, older_than: datetime | None) -> int:
        """Drops events beyond the newest `keep`, and those older than `older_than`, always a prefix
        of the log (everything up to the newest old one); how many."""
        ...

    async def wait_for_events(self, seconds: float) -> None:
        """Returns once another process may have appended events (PostgreSQL: a NOTIFY sent in
        the appending transaction, on commit), or after `seconds`: the caller then reads
        the log. SQLite, which one process writes, just waits."""
        ...


class Erasure(Protocol):
    """DeleteSession: a session's tombstone, and what remains to erase on disk."""

    async def erase_session(
        self,
        session_id: str,
        event: NewEvent,
        request: NewRequest | None = None,
        erasure: dict[str, Any] | None = None,
    ) -> EventRecord:
        """DeleteSession's commit point, one transaction: the session becomes a tombstone (its id,
        owner and creation time; no workspace, no options) holding `erasure`, what remains to
        erase on disk, until `finish_erasure`; its pending cuts, rewinds, snapshot records, points index
        and request ids (their fingerprints and results hold prompt and turn text) are deleted, the
        file paths in its earlier events are blanked, `request` is recorded as done, and `event`
        (SESSION_DELETED) is appended; returns it, with its cursor. What was deleted does not
        survive in the store's files either. From then on `session` and `sessions` do not
        return it, and `add_session` of its id fails.

        LookupError when there is no such session (or it is deleted already); RequestIdTaken
        when the request id is recorded (for whatever call)."""
        ...

    async def tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of a deleted session; None for a live session or an unknown id."""
        ...

    async def unfinished_erasures(self) -> list[Tombstone]:
        """Tombstones whose erasure on disk is not known to be finished (a crash midway)."""
        ...

    async def finish_erasure(self, session_id: str) -> None:
        """Everything on disk is erased: the tombstone forgets what its erasure needed."""
        ...


class Egress(Protocol):
    """The hosts each turn's commands reached: what a rewind of the turn cannot undo."""

    async def record_egress(self, record: EgressRecord) -> None:
        """Keeps that a turn's commands reached a host (again: no change)."""

    async def egress(self, session_id: str) -> list[EgressRecord]:
        """The session's, in the order first recorded."""
        ...


class WebhookCursors(Protocol):
    """Webhook delivery (webhooks/): a cursor per URL, and the lease that lets one replica at a
    time deliver its events."""

    async def claim_webhook(self, url: str, holder: str, lease_s: float) -> WebhookLease | None:
        """Takes the lease on `url` for `holder` for `lease_s` seconds, when it is free (lapsed, or
        never held) or `holder`'s already (a new epoch either way); None while another holds it.
        A URL first seen starts at the newest cursor: it is sent the events from then on."""
        ...

    async def renew_webhook(self, lease: WebhookLease, holder: str, lease_s: float) -> bool:
        """Extends a lease that has not lapsed; False when it has (or was taken): claim again."""
        ...

    async def advance_webhook(
        self, lease: WebhookLease, cursor: int, *, delivered: int = 0, failure: WebhookFailure | None = None
    ) -> bool:
        """Moves the URL's cursor forward to `cursor` (counting `delivered` events delivered, and
        recording `failure`), only while `lease` is current; False, changing nothing, otherwise."""
        ...

    async def advance_webhooks(self, moves: Sequence[WebhookMove]) -> list[bool]:
        """`advance_webhook` of each move, in one transaction (one sync to disk for every URL's
        move); whether each moved."""
        ...

    async def release_webhook(self, lease: WebhookLease) -> None:
        """Ends the lease now (a clean stop): another replica may claim it at once."""
        ...

    async def webhooks(self) -> list[WebhookRecord]:
        """Every URL ever delivered to, by URL."""
        ...

    async def webhook_failures(self, url: str, limit: int = 100) -> list[WebhookFailure]:
        """The URL's newest failed events, newest first."""
        ...


class Ledger(
    Sessions,
    Requests,
    Cuts,
    PointIndex,
    Rewinds,
    ReplicaDirectory,
    SnapshotOrder,
    StorageBook,
    EventLog,
    Erasure,
    Egress,
    WebhookCursors,
    Protocol,
):
    """Durable state shared by everything the service does: every part above, for whoever needs
    several. Implementations: SqliteLedger and PostgresLedger, both `store/sql/`'s SqlLedger."""

    async def close(self) -> None: ...

    async def schema_version(self) -> int:
        """The version of the schema (each implementation numbers its own migrations)."""
        ...

    async def secret(self, name: str, size: int = 32) -> bytes:
        """A random secret of the deployment, made on first use and the same ever after."""
        ...
