"""The records the ledger keeps and answers with (store/ledger.py is the interface that speaks in
them): each session's, each rewind's, each request id's, the event log's, the points index's, the
replica directory's and webhook delivery's; and the errors the ledger raises of its own."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    cwd: str
    options: dict[str, Any]
    checkpointing: bool
    create_time: datetime
    update_time: datetime
    closed: bool
    # Whether the CLI has been started once (a transcript may exist to resume).
    started: bool
    principal: str = ""
    workspace_snapshots: bool = False
    # The replica that owns it (holds its workspace and live process); "" for a session created
    # before replicas were recorded, which the only replica of its deployment owns.
    replica: str = ""
    forked_from: ForkOrigin | None = None  # set on a session ForkSession made


@dataclass(frozen=True)
class ForkOrigin:
    """Where a fork came from: its source session, and the prompt it was forked just before
    ("" for a fork of the whole session)."""

    session_id: str
    message_id: str


@dataclass(frozen=True)
class NewSession:
    session_id: str
    cwd: str
    options: dict[str, Any]
    checkpointing: bool
    principal: str = ""
    workspace_snapshots: bool = False
    replica: str = ""
    forked_from: ForkOrigin | None = None


@dataclass(frozen=True)
class EgressRecord:
    """A host a turn's commands reached through the sandbox's egress proxy (a side effect)."""

    session_id: str
    prompt_id: str
    host: str
    port: int


# Why a fenced replica's write is refused (ReplicaUnavailable's detail).
FENCED = "this replica was registered again elsewhere (a newer epoch); its writes are refused"


@dataclass(frozen=True)
class ReplicaRecord:
    """A replica of the service in the directory: where the others reach it, and its lease."""

    replica_id: str
    address: str
    # Every registration bumps it: the fencing token of that incarnation of the replica.
    epoch: int
    lease_expires: datetime
    # Whether its lease had not expired when this was read (by the database's clock).
    alive: bool


@dataclass(frozen=True)
class Anchor:
    """A conversation cut the transcript does not show yet."""

    session_id: str
    anchor_uuid: str
    target_message_id: str
    transcript_size: int
    drops_turn: str | None
    rewind_id: str


@dataclass(frozen=True)
class PointRow:
    """One visible rewind point as the points index keeps it (`PointIndex`): what a `RewindPoint`
    is made of, minus what is computed at read from the session's head (the checkpoint window,
    whether it lies before the newest compaction)."""

    idx: int  # 0-based turn number on the visible chain
    uuid: str  # the prompt entry's transcript uuid (a copy's own, not its original's)
    message_id: str  # the id clients see (a copy's original)
    resume_at_message_id: str
    anchor: str  # the uuid of the entry the CLI resumes at for a rewind to it; "" for the first
    text: str  # the prompt's first PREVIEW_CHARS + 1 characters (enough to know it was cut)
    create_time: datetime | None
    # The order of the prompt's first file-history snapshot in the transcript; None: not written.
    snapshot_pos: int | None
    compactions: int  # compact boundaries on its chain up to it
    copy: bool  # a service's copy of a compacted conversation's prompt


@dataclass(frozen=True)
class PointsHead:
    """A session's points index as a whole: what it covers of the transcript, and the facts of
    the visible conversation that every point's rendering needs."""

    session_id: str
    covered: int  # transcript bytes (complete lines) the index was made from
    digest: str  # sha256 of the (up to 4 KiB of) transcript bytes just before `covered`
    leaf: str  # the visible view's leaf uuid ("" none)
    # What reading the transcript on from `covered` needs of the leaf entry (transcript/tail.py).
    seed: dict[str, Any]
    count: int  # visible points
    last_message_id: str
    snapshot_count: int  # file-history snapshots in the transcript (every branch's)
    leaf_compactions: int
    # The owner's live process ran the newest prompt (it holds that prompt's checkpoint before
    # the CLI writes it down), as the owner last recorded it.
    holds_newest: bool
    cut: str  # the pending cut's anchor the view is cut at ("" none)


@dataclass(frozen=True)
class PointsUpdate:
    """A change of a session's points index: the rows from `keep` on are replaced by `added`,
    and the kept rows in `positions` (uuid, snapshot order) learn their snapshot's order."""

    head: PointsHead
    keep: int
    added: tuple[PointRow, ...] = ()
    positions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class NewRequest:
    """An idempotent call: its request id, what it was, and a fingerprint of all its arguments."""

    request_id: str
    method: str
    fingerprint: str
    session_id: str


@dataclass(frozen=True)
class RequestRecord:
    request_id: str
    method: str
    fingerprint: str
    session_id: str
    done: bool
    result: dict[str, Any] | None
    create_time: datetime

    def same_call(self, request: NewRequest) -> bool:
        return (self.method, self.fingerprint, self.session_id) == (
            request.method,
            request.fingerprint,
            request.session_id,
        )


@dataclass(frozen=True)
class NewRewind:
    """A rewind's intent, recorded before anything is applied."""

    rewind_id: str
    session_id: str
    message_id: str
    mode: str
    plan: dict[str, Any]
    principal: str = ""
    request: NewRequest | None = None
    kind: str = "rewind"  # or "undo"


@dataclass(frozen=True)
class RewindRecord:
    rewind_id: str
    session_id: str
    request_id: str | None
    message_id: str
    mode: str
    state: str  # "pending" or "applied"
    files_applied: bool
    plan: dict[str, Any]
    result: dict[str, Any] | None
    principal: str
    occur_time: datetime
    kind: str = "rewind"
    # The cursor of the event that recorded it once applied.
    cursor: int | None = None


@dataclass(frozen=True)
class NewEvent:
    """A change of a session's history, appended to the event log in the same transaction."""

    kind: str  # "REWOUND", "UNDONE" or "SESSION_DELETED"
    session_id: str
    rewind_id: str = ""
    principal: str = ""
    # A summary: ids, mode, counts. Never the text of a message.
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EventRecord:
    cursor: int
    kind: str
    session_id: str
    rewind_id: str
    principal: str
    occur_time: datetime
    data: dict[str, Any]


@dataclass(frozen=True)
class NewSnapshot:
    """A workspace snapshot taken for a session (snapshots/): where in its history, and what."""

    session_id: str
    # "turn_start", "turn_end", "rewind_before" or "rewind_after".
    kind: str
    # The turn's prompt id (turn_*), or the rewind's id (rewind_*).
    ref: str
    # The snapshot store's tree id; None when nothing could be taken.
    tree: str | None
    complete: bool
    reason: str = ""


@dataclass(frozen=True)
class StorageRecord:
    """What a session held when last measured (storage/usage.py), and the time before which
    retention pruned what files rewinds need (storage/retention.py): a point sent before it is
    `files_pruned`."""

    session_id: str
    principal: str
    workspace_bytes: int
    history_bytes: int
    measure_time: datetime | None  # None: never measured (a row retention made)
    files_pruned_before: datetime | None = None


@dataclass(frozen=True)
class SnapshotRecord:
    seq: int  # increasing in the order they were taken, per ledger
    session_id: str
    kind: str
    ref: str
    tree: str | None
    complete: bool
    reason: str
    occur_time: datetime


@dataclass(frozen=True)
class Tombstone:
    """What remains of a deleted session (DeleteSession): no content, only that it existed."""

    session_id: str
    principal: str
    create_time: datetime
    deleted_time: datetime
    # What remains to erase on disk (`erasure` of `erase_session`) until `finish_erasure`; None
    # once everything is gone.
    erasure: dict[str, Any] | None
    # The replica that owned it: the one whose disk holds what remains to erase.
    replica: str = ""


class SchemaTooNew(Exception):
    """The ledger was written by a newer version: this one must not touch it (no downgrades)."""

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"the ledger's schema is version {found}, newer than this agent-rewind knows ({known}): "
            "run the newer version, or restore a backup taken before the upgrade"
        )


class RequestIdTaken(Exception):
    """A request id is already recorded (the caller compares it with its own call)."""

    def __init__(self, existing: RequestRecord) -> None:
        super().__init__(existing.request_id)
        self.existing = existing


@dataclass(frozen=True)
class WebhookLease:
    """This replica's hold on delivering one URL's events: the cursor delivery resumes after,
    and the lease's epoch, which every advance of the cursor names (a lapsed or taken-over
    lease's advance changes nothing)."""

    url: str
    cursor: int
    epoch: int


@dataclass(frozen=True)
class WebhookFailure:
    """An event a URL was given up on after its last attempt."""

    url: str
    cursor: int
    attempts: int
    error: str
    occur_time: datetime


@dataclass(frozen=True)
class WebhookMove:
    """One URL's cursor moved forward (`advance_webhooks`): `delivered` events delivered up to
    `cursor`, or `failure` recorded."""

    lease: WebhookLease
    cursor: int
    delivered: int = 0
    failure: WebhookFailure | None = None


@dataclass(frozen=True)
class WebhookRecord:
    """A URL's delivery as the ledger has it: its cursor, who delivers it, what it did so far."""

    url: str
    cursor: int
    holder: str
    lease_expires: datetime
    # Whether the lease had not expired when this was read (by the ledger's clock).
    held: bool
    delivered: int
    failed: int
    last_error: str
    update_time: datetime


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)
